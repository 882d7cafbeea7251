"""The main thread's rollout phase and actor update while a helper thread that ran torch lives,
against none (``crl_harness.models.fresh_thread``: why a live one slows them).

Builds a ``Trainer`` of ``--config`` (default ``cpu-demo``, its engines as ``auto`` chooses),
plays one rollout phase for the rows of the update, then alternates two sides ``--repeats``
times, each timing the same rollout phase (step 1's levels, nothing retrieved) and the actor's
update on those rows from the same adapters and AdamW state:
- ``none``: no other thread has run torch (what the trainer does now: the extractor's batches
  run in threads that end with them);
- ``live``: a thread that ran one extractor generation (as the background distillation's
  long-lived thread did before) is alive and idle.
Printed: each side's median seconds, the cores busy meanwhile (``/proc/stat``, the machine's:
measure quiet) and the ratio.

    .venv/bin/python benchmarks/helper_thread_bench.py
    .venv/bin/python benchmarks/helper_thread_bench.py --repeats 3 --set actor.rollout_engine=hf
"""

from __future__ import annotations

import argparse
import copy
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path


def busy_cores(since: tuple[int, int] | None = None) -> tuple[int, int] | float:
    """``/proc/stat``'s (total, idle) jiffies, or with ``since`` the cores busy between."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    now = (sum(values), values[3] + values[4])
    if since is None:
        return now
    total, idle = now[0] - since[0], now[1] - since[1]
    return (os.cpu_count() or 1) * (1 - idle / max(total, 1))


class LiveHelper:
    """A thread that runs ``work`` once and then waits, alive, until ``stop``."""

    def __init__(self, work: Callable[[], object]) -> None:
        self._release = threading.Event()
        ran = threading.Event()

        def body() -> None:
            work()
            ran.set()
            self._release.wait()

        self._thread = threading.Thread(target=body, daemon=True, name="live-helper")
        self._thread.start()
        ran.wait()

    def stop(self) -> None:
        self._release.set()
        self._thread.join()


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--repeats", type=int, default=2, help="timings per side (1..10)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config override (repeatable)")
    args = parser.parse_args()
    if not 1 <= args.repeats <= 10:
        parser.error("--repeats must be in 1..10")
    if not Path("/proc/stat").exists():
        parser.error("needs Linux's /proc/stat for the cores busy")

    import torch

    from crl_harness.config import ConfigError, load_config
    from crl_harness.training.batches import actor_rows
    from crl_harness.training.losses import grpo_loss
    from crl_harness.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="crl-helper-bench-") as out:
        try:
            cfg = load_config(args.config, [f"run.output_dir={out}/run", "run.tensorboard=false",
                                            *args.set])
        except ConfigError as err:
            parser.error(str(err))
        if not cfg.uses_experience:
            parser.error(f"arm {cfg.arm} has no extractor to run in a helper thread")
        trainer = Trainer(cfg)
        try:
            extractor = getattr(trainer.experience, "backend", None)
            if extractor is None:
                sys.exit("helper_thread_bench: the extractor lives in another process here")
            learner, specs = trainer.actor, trainer._episode_specs(trainer.sampler.sample(1),
                                                                   retrieve=False)
            loss = functools.partial(grpo_loss, clip_eps=cfg.actor.clip_eps)
            results = trainer.rollouts.run(specs)  # also the engines' first, untimed, phase
            rows, _ = actor_rows([t for t in results if not t.error],
                                 normalize_std=cfg.actor.normalize_std)
            state, optimizer = learner.trainable_state_dict(), learner.optimizer_state()
            print(f"{args.config}: {cfg.actor.rollout_engine} rollouts of {len(specs)} episodes, "
                  f"an update of {len(rows)} rows, {torch.get_num_threads()} torch threads")

            def one_generation() -> None:
                extractor.generate([[{"role": "user", "content": "Say one word."}]],
                                   max_new_tokens=8, temperature=0.7, top_p=1.0)

            def update() -> None:
                learner.load_trainable_state_dict(state)
                learner.load_optimizer_state(copy.deepcopy(optimizer))
                learner.update(rows, loss)

            learner.update(rows, loss)  # a process's first update runs long (fresh pages)
            timings: dict[str, dict[str, list[tuple[float, float]]]] = {
                side: {"rollouts": [], "update": []} for side in ("none", "live")}
            for _ in range(args.repeats):
                for side in ("none", "live"):
                    helper = LiveHelper(one_generation) if side == "live" else None
                    try:
                        for phase, work in (("rollouts", lambda: trainer.rollouts.run(specs)),
                                            ("update", update)):
                            since, start = busy_cores(), time.perf_counter()
                            work()
                            timings[side][phase].append((time.perf_counter() - start,
                                                         busy_cores(since)))
                    finally:
                        if helper is not None:
                            helper.stop()
            for phase in ("rollouts", "update"):
                none, live = ([statistics.median(t for t, _ in timings[side][phase]),
                               statistics.median(c for _, c in timings[side][phase])]
                              for side in ("none", "live"))
                print(f"{phase}: none {none[0]:.1f} s ({none[1]:.2f} cores busy), live helper "
                      f"{live[0]:.1f} s ({live[1]:.2f} cores): {live[0] / none[0]:.2f}x "
                      f"(medians of {args.repeats})", flush=True)
        finally:
            trainer.close()


if __name__ == "__main__":
    main()
