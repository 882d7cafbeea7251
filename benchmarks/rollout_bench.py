"""Rollout throughput: episodes/s and generated tokens/s, HF vs vLLM in the same run.

Plays the same episode specs (same env, seeds, turn cap, sampling settings) with each backend
through ``RolloutEngine`` and prints the median of ``--repeats`` timed runs (after one warm-up
run), then the vLLM/HF ratio. Default: SmolLM2-135M on CRL/MiniHackRoom-v0, 32 episodes of 4
turns, 64 new tokens a reply.

    .venv/bin/python benchmarks/rollout_bench.py
    .venv/bin/python benchmarks/rollout_bench.py --backends hf --episodes 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="short name or local path")
    parser.add_argument("--env", default="CRL/MiniHackRoom-v0")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per run (one batch)")
    parser.add_argument("--turns", type=int, default=4, help="turn cap per episode")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--backends", default="hf,vllm", help="comma-separated: hf, vllm")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from crl_harness.models import load_backend
    from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    specs = [EpisodeSpec(args.env, seed=s) for s in range(args.episodes)]
    config = RolloutConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           max_live=args.episodes, seed=0,
                           env_kwargs={args.env: {"max_episode_steps": args.turns}})
    print(f"{args.env}: {args.episodes} episodes x {args.turns} turns, {args.max_new_tokens} "
          f"new tokens max, temperature {args.temperature}, {args.threads} threads, "
          f"median of {args.repeats}")
    rates: dict[str, tuple[float, float]] = {}
    for kind in args.backends.split(","):
        backend = load_backend(f"{kind}:{args.model}")
        engine = RolloutEngine(backend, config=config)
        engine.run(specs[: max(1, args.episodes // 4)])  # warm-up (kernels, allocator, envs)
        episode_rates, token_rates, prompt_tokens = [], [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            trajectories = engine.run(specs)
            seconds = time.perf_counter() - start
            tokens = sum(t.generated_tokens for t in trajectories)
            episode_rates.append(len(trajectories) / seconds)
            token_rates.append(tokens / seconds)
            prompt_tokens.append(statistics.mean(len(turn.prompt_token_ids)
                                                 for t in trajectories for turn in t.turns))
        rates[kind] = (statistics.median(episode_rates), statistics.median(token_rates))
        print(f"{kind:5s} {rates[kind][0]:7.2f} episodes/s {rates[kind][1]:8.1f} generated tok/s"
              f"  (runs: {', '.join(f'{r:.0f}' for r in token_rates)} tok/s; mean prompt "
              f"{statistics.mean(prompt_tokens):.0f} tokens)", flush=True)
        engine.close()
        backend.close()
    if "hf" in rates and "vllm" in rates:
        print(f"vllm/hf: {rates['vllm'][0] / rates['hf'][0]:.2f}x episodes/s, "
              f"{rates['vllm'][1] / rates['hf'][1]:.2f}x generated tok/s")


if __name__ == "__main__":
    main()
