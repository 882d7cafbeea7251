"""Key coverage: how many held-out levels share a retrieval key with a level training plays?

    .venv/bin/python benchmarks/key_coverage.py                          # cpu-demo, 96 levels
    .venv/bin/python benchmarks/key_coverage.py --set tasks.groups_per_step=8 \\
        --set tasks.group_size=4 --set tasks.guided_per_group=2 --set tasks.new_per_step=4
    .venv/bin/python benchmarks/key_coverage.py --print-pool 36 --min-count 6 --per-key 2

A bank built in training can lift an unseen level only through a lesson of that level's key
(with exact keys, as MiniHack's and Sokoban's, a level of another key gets nothing). So the
levels the schedule plays bound what held-out-with-the-bank can show before any lesson is
written. Model-free, seconds: every level is reset once to read its key
(``info["retrieval_query"]``); the schedule is the trainer's own ``TaskSampler`` over
``run.steps`` (``--steps``). Printed for the config's first env: the held-out levels (from
``tasks.heldout_offset``, as ``crl demo`` and ``efficacy.py`` evaluate them) whose key a level
the schedule plays holds, and the same for the whole pool (every level played once).

``--print-pool SIZE`` prints a pool instead, as a ``tasks.seeds`` override: the first ``--scan``
levels of the seed range are reset and grouped by key; each key that at least ``--min-count`` of
them hold gives its first level, then the most frequent keys give further levels (up to
``--per-key`` a key) until the pool holds ``SIZE``. Several levels of one key let a lesson's
record (its wins and losses when used, which retrieval ranks a key's lessons by) be judged on
levels other than the one that wrote it, which is what a lesson meant to transfer must survive.
"""

from __future__ import annotations

import argparse

MAX_STEPS = 1000
MAX_POOL = 1000  # a larger pool (a seed range) is not reset level by level: its line is left out
MAX_SCAN = 100_000


def pool_by_key(keys: dict[int, str], size: int, min_count: int, per_key: int) -> list[int]:
    """``size`` seeds of ``keys`` (seed -> key): the first level of each key that ``min_count``
    seeds hold, most frequent key first, then further levels of the most frequent keys, at most
    ``per_key`` a key; sorted.

    >>> pool_by_key({0: "a", 1: "a", 2: "b", 3: "a", 4: "c", 5: "b"}, 4, 2, 2)
    [0, 1, 2, 5]
    """
    by_key: dict[str, list[int]] = {}
    for seed in sorted(keys):
        by_key.setdefault(keys[seed], []).append(seed)
    frequent = sorted((seeds for seeds in by_key.values() if len(seeds) >= min_count),
                      key=lambda seeds: (-len(seeds), seeds[0]))
    chosen = [seed for rank in range(per_key) for seeds in frequent if rank < len(seeds)
              for seed in seeds[rank:rank + 1]]
    return sorted(chosen[:size])


def main() -> None:
    from crl_harness.config import HELDOUT_RESERVED, ConfigError, load_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--levels", type=int, default=96,
                        help=f"held-out levels (1..{HELDOUT_RESERVED})")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps the schedule runs (1..{MAX_STEPS}; default run.steps)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config override (repeatable)")
    parser.add_argument("--print-pool", type=int, default=None, metavar="SIZE",
                        help=f"print a pool of SIZE levels (1..{MAX_POOL}) as a tasks.seeds "
                             "override and stop")
    parser.add_argument("--scan", type=int, default=400,
                        help=f"levels of the seed range --print-pool reads (1..{MAX_SCAN})")
    parser.add_argument("--min-count", type=int, default=1,
                        help="--print-pool: a key needs this many of the scanned levels (>= 1)")
    parser.add_argument("--per-key", type=int, default=2,
                        help="--print-pool: at most this many levels a key (>= 1)")
    args = parser.parse_args()
    if args.print_pool is not None and not 1 <= args.print_pool <= MAX_POOL:
        parser.error(f"--print-pool must be in 1..{MAX_POOL}")
    if not 1 <= args.scan <= MAX_SCAN:
        parser.error(f"--scan must be in 1..{MAX_SCAN}")
    if args.min_count < 1 or args.per_key < 1:
        parser.error("--min-count and --per-key must be at least 1")
    if not 1 <= args.levels <= HELDOUT_RESERVED:
        parser.error(f"--levels must be in 1..{HELDOUT_RESERVED}")
    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        parser.error(f"--steps must be in 1..{MAX_STEPS}")
    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as err:
        parser.error(str(err))

    import gymnasium as gym

    from crl_envs import exact_retrieval_key
    from crl_harness.training.sampler import TaskSampler

    entry = cfg.tasks.envs[0]
    if not exact_retrieval_key(entry.id):
        parser.error(f"{entry.id} has no exact retrieval key (MiniHack and Sokoban have): a lesson "
                     "there is found by similarity, so its reach is not a count of shared keys")
    env = gym.make(entry.id, **dict(entry.kwargs))

    def key(seed: int) -> str:
        _, info = env.reset(seed=seed, options=dict(entry.options) or None)
        return str(info.get("retrieval_query", ""))

    if args.print_pool is not None:
        start = cfg.tasks.seed_offset
        seeds = pool_by_key({seed: key(seed) for seed in range(start, start + args.scan)},
                            args.print_pool, args.min_count, args.per_key)
        env.close()
        if len(seeds) < args.print_pool:
            parser.error(f"only {len(seeds)} levels meet --min-count {args.min_count} and "
                         f"--per-key {args.per_key} in {args.scan} scanned; scan more or ask less")
        print(f"tasks.seeds=[{','.join(map(str, seeds))}]")
        return
    steps = args.steps or cfg.run.steps
    sampler = TaskSampler(cfg.tasks, cfg.run.seed)
    played = {d.seed for step in range(1, steps + 1) for d in sampler.sample(step)
              if d.env_index == 0}
    seeds = cfg.tasks.training_seeds()
    whole = len(seeds) <= MAX_POOL
    pool = {seed: key(seed) for seed in (set(seeds) if whole else played)}
    offset = cfg.tasks.heldout_offset
    heldout = [key(seed) for seed in range(offset, offset + args.levels)]
    env.close()

    def covered(seeds: set[int]) -> int:
        keys = {pool[s] for s in seeds}
        return sum(k in keys for k in heldout)

    print(f"{args.config} ({entry.id}), run.seed {cfg.run.seed}: {args.levels} held-out levels "
          f"from {offset}, {len(set(heldout))} distinct keys")
    print(f"the schedule ({cfg.tasks.schedule}, {cfg.tasks.groups_per_step} groups a step, "
          f"{steps} steps) plays {len(played)} levels of {len({pool[s] for s in played})} keys: "
          f"{covered(played)}/{args.levels} held-out levels share a key with one of them")
    if whole:
        print(f"the whole pool ({len(pool)} levels of {len(set(pool.values()))} keys): "
              f"{covered(set(pool))}/{args.levels}")


if __name__ == "__main__":
    main()
