"""Steps per second of the CRL MiniHack text envs against the bare upstream MiniHack envs.

Three sides play the same random moves (8 compass directions) in the same process, resetting
when an episode ends; each figure is the median of several interleaved runs:
- ``raw``: the upstream env as MiniHack builds it (its default observation, cropped views included);
- ``raw-narrow``: the same env asked only for the keys our text view reads (what we run on);
- ``ours``: ``MiniHackEnv`` (text rendering, fog of war, the contract's checks and info).

    .venv/bin/python benchmarks/minihack_speed.py [--steps 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from crl_envs.minihack.env import _OBSERVATION_KEYS, DIRECTIONS, TASKS, MiniHackEnv, make_raw_env


def raw_steps_per_second(task: str, steps: int, seed: int, narrow: bool) -> float:
    env = make_raw_env(task, observation_keys=_OBSERVATION_KEYS if narrow else None)
    moves = [env.unwrapped.actions.index(direction) for direction in DIRECTIONS.values()]
    rng = random.Random(seed)
    env.reset()
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.choice(moves))
        if terminated or truncated:
            env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def text_steps_per_second(task: str, steps: int, seed: int) -> float:
    env = MiniHackEnv(task=task)
    moves = list(DIRECTIONS)
    rng = random.Random(seed)
    env.reset(seed=seed)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(rng.choice(moves))
        if terminated or truncated:
            env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per side (the median is printed)")
    args = parser.parse_args()
    print(f"{'task':<8} {'raw':>8} {'raw-narrow':>11} {'ours':>8} {'ours/raw':>9} {'ours/narrow':>12}  (steps/s)")
    for task in TASKS:
        raw, narrow, ours = [], [], []
        for run in range(args.runs):  # interleaved, so that machine load hits every side alike
            raw.append(raw_steps_per_second(task, args.steps, seed=run, narrow=False))
            narrow.append(raw_steps_per_second(task, args.steps, seed=run, narrow=True))
            ours.append(text_steps_per_second(task, args.steps, seed=run))
        raw_m, narrow_m, ours_m = (statistics.median(x) for x in (raw, narrow, ours))
        print(
            f"{task:<8} {raw_m:>8.0f} {narrow_m:>11.0f} {ours_m:>8.0f}"
            f" {ours_m / raw_m:>9.2f} {ours_m / narrow_m:>12.2f}"
        )

if __name__ == "__main__":
    main()
