"""Success rate of the text-only MiniHack oracle within the registered step limits, over many seeds.

    .venv/bin/python benchmarks/minihack_oracle.py [--seeds 200] [--ids CRL/MiniHackRoom-v0 ...]
        [--max-steps N]   # another step limit than the registered one (30; River 100)

Prints, per env id (and per Room variant): wins / seeds, the rate, the mean number of steps of
the won episodes, and how the lost ones ended (truncated at the limit or terminated: death).
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.minihack.oracle import MiniHackOracle
from crl_envs.oracles import play_episode

CASES = [
    ("CRL/MiniHackRoom-v0", {}),
    ("CRL/MiniHackRoom-v0", {"variant": "plain"}),
    ("CRL/MiniHackRoom-v0", {"variant": "random"}),
    ("CRL/MiniHackRoom-v0", {"variant": "dark"}),
    ("CRL/MiniHackMaze-v0", {}),
    ("CRL/MiniHackKeyRoom-v0", {}),
    ("CRL/MiniHackRiver-v0", {}),
]


def evaluate(env_id: str, kwargs: dict, seeds: int, max_steps: int | None) -> dict:
    env = gym.make(env_id, max_episode_steps=max_steps, **kwargs)
    oracle = MiniHackOracle(env)
    wins, won_steps, truncated_count, terminated_lost = 0, [], 0, 0
    for seed in range(seeds):
        episode = play_episode(env, oracle, seed=seed)
        if episode.won:
            wins += 1
            won_steps.append(episode.steps)
        elif episode.truncated:
            truncated_count += 1
        else:
            terminated_lost += 1
    env.close()
    return {
        "wins": wins,
        "mean_steps": sum(won_steps) / max(len(won_steps), 1),
        "truncated": truncated_count,
        "died": terminated_lost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200, help="seeds 0..N-1 per case")
    parser.add_argument("--ids", nargs="*", help="only these env ids")
    parser.add_argument("--max-steps", type=int, default=None, help="step limit (default: registered)")
    args = parser.parse_args()
    print(f"{'env':<36} {'won':>9} {'rate':>6} {'steps':>6} {'trunc':>6} {'died':>5} {'secs':>5}")
    for env_id, kwargs in CASES:
        if args.ids and env_id not in args.ids:
            continue
        start = time.perf_counter()
        result = evaluate(env_id, kwargs, args.seeds, args.max_steps)
        name = env_id + "".join(f" {k}={v}" for k, v in kwargs.items())
        print(
            f"{name:<36} {result['wins']:>4}/{args.seeds:<4} {result['wins'] / args.seeds:>6.1%}"
            f" {result['mean_steps']:>6.1f} {result['truncated']:>6} {result['died']:>5}"
            f" {time.perf_counter() - start:>5.0f}"
        )


if __name__ == "__main__":
    main()
