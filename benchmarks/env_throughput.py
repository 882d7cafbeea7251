"""Steps per second of every CRL env under random valid actions.

For MiniHack also the raw MiniHack env (same task, random actions from its own action space) in
the same run, and the ratio CRL/raw (goal: at least 0.8x). For Sokoban also the median time to
generate and verify one level (goal: 1 ms or less).

    .venv/bin/python benchmarks/env_throughput.py [--steps 2000] [--repeats 5] [--envs ID ...]

Envs whose data (or Docker daemon) is missing are reported as skipped.
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np

import crl_envs
from crl_envs.errors import UserFacingError

MINIHACK = {
    "CRL/MiniHackRoom-v0": "room",
    "CRL/MiniHackMaze-v0": "maze",
    "CRL/MiniHackKeyRoom-v0": "keyroom",
    "CRL/MiniHackRiver-v0": "river",
}
FREE_TEXT = {"CRL/SWEBench-v0", "CRL/SWEBenchToy-v0"}  # no finite action set to sample from


def crl_steps_per_second(env_id: str, steps: int, seed: int) -> float:
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    _, info = env.reset(seed=seed)
    start = time.perf_counter()
    for _ in range(steps):
        actions = info["admissible_actions"]
        _, _, terminated, truncated, info = env.step(actions[rng.integers(len(actions))])
        if terminated or truncated:
            _, info = env.reset(seed=int(rng.integers(1 << 30)))
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def raw_minihack_steps_per_second(task: str, steps: int, seed: int) -> float:
    from crl_envs.minihack.env import make_raw_env

    env = make_raw_env(task)
    env.action_space.seed(seed)
    env.reset(seed=seed)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def sokoban_level_times_ms(levels: int, seed: int) -> list[float]:
    from crl_envs.sokoban.generator import generate_level

    rng = np.random.default_rng(seed)
    times = []
    for _ in range(levels):
        start = time.perf_counter()
        generate_level(rng)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--levels", type=int, default=1000)
    parser.add_argument("--envs", nargs="*", default=[i for i in crl_envs.ENV_IDS if i not in FREE_TEXT])
    args = parser.parse_args()

    print(f"{'env':28} {'CRL steps/s':>12} {'raw steps/s':>12} {'ratio':>7}   (median of {args.repeats})")
    for env_id in args.envs:
        try:
            gym.make(env_id).close()
        except UserFacingError as err:
            print(f"{env_id:28} skipped: {err}")
            continue
        steps = args.steps if env_id not in {"CRL/ALFWorld-v0"} else max(50, args.steps // 20)
        ours, raws = [], []
        for r in range(args.repeats):
            # interleave both sides so machine load affects them alike
            ours.append(crl_steps_per_second(env_id, steps, seed=r))
            if env_id in MINIHACK:
                raws.append(raw_minihack_steps_per_second(MINIHACK[env_id], steps, seed=r))
        ours_med = statistics.median(ours)
        if raws:
            raw_med = statistics.median(raws)
            print(f"{env_id:28} {ours_med:12.0f} {raw_med:12.0f} {ours_med / raw_med:6.2f}x")
        else:
            print(f"{env_id:28} {ours_med:12.0f} {'-':>12} {'-':>7}")
    if "CRL/Sokoban-v0" in args.envs:
        times = [t for r in range(args.repeats) for t in sokoban_level_times_ms(args.levels, seed=r)]
        print(f"Sokoban level generation (incl. solvability check): median "
              f"{statistics.median(times):.3f} ms/level, p90 {np.percentile(times, 90):.3f} ms "
              f"over {len(times)} levels")

if __name__ == "__main__":
    main()
