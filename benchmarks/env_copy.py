"""Time ``copy.deepcopy`` of a made CRL env after reset (tree search copies envs thousands of times).

Prints the median of ``--repeats`` copies in milliseconds (goal for Sokoban: 5 ms or less).

    .venv/bin/python benchmarks/env_copy.py [--env CRL/Sokoban-v0] [--repeats 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the ids)


def copy_times(env_id: str, repeats: int) -> list[float]:
    """Seconds per ``copy.deepcopy`` of ``gym.make(env_id)`` reset with seed 0, ``repeats`` times."""
    env = gym.make(env_id)
    env.reset(seed=0)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        clone = copy.deepcopy(env)
        times.append(time.perf_counter() - start)
        clone.close()
    env.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CRL/Sokoban-v0")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    times = copy_times(args.env, args.repeats)
    print(f"{args.env}: deepcopy after reset, median of {args.repeats}: "
          f"{1000 * statistics.median(times):.2f} ms (min {1000 * min(times):.2f}, "
          f"max {1000 * max(times):.2f})")


if __name__ == "__main__":
    main()
