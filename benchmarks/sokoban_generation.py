"""Time to generate one verified CRL/Sokoban-v0 level (goal: median 1 ms or less).

Each level is ``generate_level(numpy.random.default_rng(seed))`` for seeds ``0..levels-1``, the
way ``SokobanEnv.reset(seed=...)`` draws it: random-walk room, reverse search and the forward
solver's check, retries included. Two settings, interleaved per repeat so machine load hits both
alike:

- ``warm``: the per-layout tables (neighbours, live cells) are cached across levels, as in a
  long training run;
- ``cold``: those caches are cleared before every level, so each level pays for its own tables.

Prints, per setting, the median over repeats of the per-repeat median (and p90) ms/level, and
the distribution of optimal solution lengths.

    .venv/bin/python benchmarks/sokoban_generation.py [--levels 1000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import numpy as np

from crl_envs.sokoban.generator import generate_level
from crl_envs.sokoban.level import layout_neighbours
from crl_envs.sokoban.solver import live_cells


def level_times_ms(levels: int, cold: bool) -> tuple[list[float], Counter]:
    times, lengths = [], Counter()
    for seed in range(levels):
        if cold:
            layout_neighbours.cache_clear()
            live_cells.cache_clear()
        rng = np.random.default_rng(seed)
        start = time.perf_counter()
        level = generate_level(rng)
        times.append((time.perf_counter() - start) * 1000)
        lengths[level.solution_length] += 1
    return times, lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    medians: dict[str, list[float]] = {"warm": [], "cold": []}
    p90s: dict[str, list[float]] = {"warm": [], "cold": []}
    lengths: Counter = Counter()
    for _ in range(args.repeats):
        for setting in ("warm", "cold"):
            times, lengths = level_times_ms(args.levels, cold=setting == "cold")
            medians[setting].append(statistics.median(times))
            p90s[setting].append(float(np.percentile(times, 90)))
    print(f"Sokoban 6x6, 2 boxes: {args.levels} seeds x {args.repeats} repeats")
    for setting in ("warm", "cold"):
        print(f"  {setting}: median {statistics.median(medians[setting]):.3f} ms/level "
              f"(repeats {', '.join(f'{m:.3f}' for m in medians[setting])}), "
              f"p90 {statistics.median(p90s[setting]):.3f} ms")
    total = sum(lengths.values())
    print("  optimal solution length (moves): "
          + ", ".join(f"{n}: {100 * c / total:.0f}%" for n, c in sorted(lengths.items())))


if __name__ == "__main__":
    main()
