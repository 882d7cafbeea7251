"""Rollout throughput: generated tokens/s of the HF backend with and without KV reuse (and vLLM).

Plays the same episode specs (same env, seeds, turn cap, sampling settings, full history) with
each side through ``RolloutEngine`` and prints the median of ``--repeats`` timed runs, the time of turn ``--late-turn`` over turn 2 (the per-turn cost as the history
grows), and the ratios against the first side. Sides: ``hf`` (KV reuse, the default backend),
``hf-noreuse`` (every prompt prefilled in full: the path before KV reuse), ``vllm``.

    .venv/bin/python benchmarks/rollout_bench.py                       # issue 11's figures
    .venv/bin/python benchmarks/rollout_bench.py --sides hf,vllm --turns 4
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
    parser.add_argument("--turns", type=int, default=8, help="turn cap per episode")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--late-turn", type=int, default=8, help="turn compared with turn 2")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--sides", default="hf-noreuse,hf",
                        help="comma-separated: hf-noreuse, hf, vllm (ratios are against the first)")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from crl_harness.models import load_backend
    from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    specs = [EpisodeSpec(args.env, seed=s) for s in range(args.episodes)]
    config = RolloutConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           max_live=args.episodes, seed=0, history=None,
                           env_kwargs={args.env: {"max_episode_steps": args.turns}})
    print(f"{args.env}: {args.episodes} episodes x {args.turns} turns, full history, "
          f"{args.max_new_tokens} new tokens max, temperature {args.temperature}, "
          f"{args.threads} threads, median of {args.repeats}")
    rates: dict[str, float] = {}
    for side in args.sides.split(","):
        kind, options = ("hf", {"kv_reuse": False}) if side == "hf-noreuse" else (side, {})
        backend = load_backend(f"{kind}:{args.model}", **options)
        turn_times: list[float] = []
        generate = backend.generate

        def timed(*a, _generate=generate, _times=turn_times, **kw):
            start = time.perf_counter()
            out = _generate(*a, **kw)
            _times.append(time.perf_counter() - start)
            return out

        backend.generate = timed  # type: ignore[method-assign]
        engine = RolloutEngine(backend, config=config)
        # Warm-up (kernels, allocator): one short batch. Env creation stays in the timed runs of
        # both sides alike (the engine keeps its envs, so only the first run pays it).
        backend.generate([[{"role": "user", "content": "hi"}]] * 4, max_new_tokens=4,
                         temperature=1.0, seed=0)
        token_rates, prompt_tokens, late_ratios = [], [], []
        for _ in range(args.repeats):
            turn_times.clear()
            start = time.perf_counter()
            trajectories = engine.run(specs)
            seconds = time.perf_counter() - start
            tokens = sum(t.generated_tokens for t in trajectories)
            token_rates.append(tokens / seconds)
            prompt_tokens.append(statistics.mean(len(turn.prompt_token_ids)
                                                 for t in trajectories for turn in t.turns))
            if len(turn_times) >= args.late_turn:
                late_ratios.append(turn_times[args.late_turn - 1] / turn_times[1])
        rates[side] = statistics.median(token_rates)
        late = f"{statistics.median(late_ratios):.2f}x" if late_ratios else "n/a (episodes ended)"
        print(f"{side:10s} {rates[side]:8.1f} generated tok/s  turn {args.late_turn}/turn 2: {late}"
              f"  (runs: {', '.join(f'{r:.1f}' for r in token_rates)} tok/s; mean prompt "
              f"{statistics.mean(prompt_tokens):.0f} tokens)", flush=True)
        engine.close()
        backend.close()
    first, *others = list(rates)
    for side in others:
        print(f"{side}/{first}: {rates[side] / rates[first]:.2f}x generated tok/s")


if __name__ == "__main__":
    main()
