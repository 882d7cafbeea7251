"""The actor's update with the rows' shared prompt prefix forward-passed once, against whole rows.

``--compare attention``: instead, both sides share the prefix, and one computes a query that
continues a cache with ``continuation_attention`` (``crl_harness.models.attention``), the other
with transformers' SDPA throughout.

Plays ``--steps`` training steps' rollouts of ``--config`` (default ``cpu-demo``: the shipped
warm actor, arm none, so every episode is free) with the config's rollout engine, builds the
actor's GRPO rows as the trainer does (``actor_rows``: packed episodes, zero-advantage rows
dropped), then times ``PolicyLearner.update`` on each step's rows ``--repeats`` times a side,
the sides alternating (after one untimed update of each: a process's first update runs long),
the learner's adapters and AdamW state put back before every update (so each update starts from
the same weights and must give the same loss and gradient norm).
Printed per step: rows, tokens, the shared prefix's length, each side's median seconds and the
speed-up, and the largest loss and gradient-norm difference between the sides.

    .venv/bin/python benchmarks/actor_update_bench.py
    .venv/bin/python benchmarks/actor_update_bench.py --steps 1 --repeats 2 --set actor.rollout_engine=vllm
    .venv/bin/python benchmarks/actor_update_bench.py --compare attention --set actor.rollout_engine=vllm
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--steps", type=int, default=2, help="steps of rollouts, each timed")
    parser.add_argument("--repeats", type=int, default=3, help="updates per side and step")
    parser.add_argument("--compare", choices=("sharing", "attention"), default="sharing",
                        help="sharing: shared prefix vs whole rows (default); attention: "
                             "continuation_attention vs SDPA, both sharing")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config override (repeatable)")
    args = parser.parse_args()
    if not 1 <= args.steps <= 20 or not 1 <= args.repeats <= 20:
        parser.error("--steps and --repeats must be in 1..20")

    import tempfile

    import torch

    from crl_harness.config import ConfigError, load_config
    from crl_harness.models import attention
    from crl_harness.training.batches import actor_rows
    from crl_harness.training.learner import SharedPrefix
    from crl_harness.training.losses import grpo_loss
    from crl_harness.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="crl-update-bench-") as out:
        try:
            cfg = load_config(args.config, ["arm=none",
                                            f"run.output_dir={out}/run", "run.tensorboard=false",
                                            *args.set])
        except ConfigError as err:
            parser.error(str(err))
        trainer = Trainer(cfg)
        learner = trainer.actor
        loss = functools.partial(grpo_loss, clip_eps=cfg.actor.clip_eps)
        state = learner.trainable_state_dict()
        ratio = attention.CONTINUATION_RATIO
        optimizer = copy.deepcopy(learner.optimizer_state())
        print(f"{args.config}, {cfg.actor.dtype}, {torch.get_num_threads()} threads, micro-batch "
              f"{learner.micro_batch_size}")
        try:
            for step in range(1, args.steps + 1):
                results = trainer.rollouts.run(trainer._episode_specs(trainer.sampler.sample(step), retrieve=False))
                rows, _ = actor_rows([t for t in results if not t.error],
                                     normalize_std=cfg.actor.normalize_std)
                rows = [r for r in rows if r.trained_tokens]
                prefix = SharedPrefix.of(sorted(rows, key=lambda r: len(r.prompt_ids)),
                                         learner.model) if len(rows) > 1 else None
                tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
                times: dict[bool, list[float]] = {True: [], False: []}
                stats: dict[bool, list] = {True: [], False: []}
                # one untimed update first: the process's first one ran 1.5x as long (fresh pages)
                for repeat in range(args.repeats + (step == 1)):
                    for shared in (True, False):
                        learner.load_trainable_state_dict(state)
                        learner.load_optimizer_state(copy.deepcopy(optimizer))
                        if args.compare == "sharing":
                            learner.share_prefix = shared
                        else:  # the "shared" side is here the one with the continuation path
                            attention.CONTINUATION_RATIO = ratio if shared else float("inf")
                        start = time.perf_counter()
                        update = learner.update(rows, loss)
                        if repeat or step > 1:
                            stats[shared].append(update)
                            times[shared].append(time.perf_counter() - start)
                on, off = statistics.median(times[True]), statistics.median(times[False])
                loss_gap = max(abs(a.loss - b.loss) for a in stats[True] for b in stats[False])
                norm_gap = max(abs(a.grad_norm - b.grad_norm)
                               for a in stats[True] for b in stats[False])
                names = ("whole rows", "shared prefix") if args.compare == "sharing" else \
                    ("SDPA", "continuation attention")
                print(f"step {step}: {len(rows)} rows, {tokens} tokens, shared prefix "
                      f"{len(prefix) if prefix else 0} tokens; {names[0]} {off:.1f} s, "
                      f"{names[1]} {on:.1f} s (medians of {args.repeats}): {off / on:.2f}x; "
                      f"|loss diff| <= {loss_gap:.2e}, |grad-norm diff| <= {norm_gap:.2e}",
                      flush=True)
        finally:
            trainer.close()


if __name__ == "__main__":
    main()
