"""Do a run's lessons work? Every route lesson of a run's bank, played on the training levels
its title names, without a model: which ones win, and which levels have none.

    .venv/bin/python benchmarks/bank_replay.py runs/demo      # RUN_DIR: config.json, bank.sqlite

A route lesson ("Winning moves from KEY: from the start, play east, south.", as the warm start
teaches the extractor to write it) is played move by move from the reset of each training level
(the run's ``tasks``) whose retrieval key (``info["retrieval_query"]``) is the title's KEY; it
wins when the env reports a win before its moves run out. Printed per training level: its key,
the bank's lessons for it (copies counted once, with how many copies and their votes) and
whether each wins; a level with no lesson of its own gets another level's at retrieval (a
retrieval miss, ``experience_ceiling.py``'s ``wrong`` arm). Other entries are counted apart.
The bank is opened read-only (a live run may hold it).
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class LessonReplay:
    """One distinct route lesson played on one training level."""

    seed: int
    key: str
    moves: list[str]
    copies: int
    votes: int
    won: bool


def play_route(env: Any, seed: int, moves: list[str]) -> bool:
    """Whether ``moves`` from the reset of level ``seed`` reach a win."""
    env.reset(seed=seed)
    for move in moves:
        _, _, terminated, truncated, info = env.step(move)
        if terminated or truncated:
            return bool(info.get("won"))
    return False


def replay_bank(cfg: Any, entries: list[Any]) -> tuple[list[LessonReplay], dict[int, str | None],
                                                         int]:
    """The replays of ``entries``' route lessons on the training levels their titles name (one
    env of the config's first entry, reset per level), each training level's retrieval key
    (``None`` where the env gives none), and how many entries are not route lessons of a
    training level."""
    import gymnasium as gym

    import crl_envs  # noqa: F401  (registers the ids)
    from crl_harness.warmstart.data import route_of

    env_entry = cfg.tasks.envs[0]
    env = gym.make(env_entry.id, **env_entry.kwargs)
    try:
        keys = {seed: env.reset(seed=seed)[1].get("retrieval_query")
                for seed in cfg.tasks.training_seeds()}
        seeds_of: dict[str, list[int]] = {}
        for seed, key in keys.items():
            if key:
                seeds_of.setdefault(key, []).append(seed)
        copies: Counter[tuple[str, tuple[str, ...]]] = Counter()
        votes: Counter[tuple[str, tuple[str, ...]]] = Counter()
        for entry in entries:
            route = route_of(entry)
            if route is not None and route[0] in seeds_of:
                copies[route[0], tuple(route[1])] += 1
                votes[route[0], tuple(route[1])] += entry.votes
        replays = [LessonReplay(seed, key, list(moves), n, votes[key, moves],
                                play_route(env, seed, list(moves)))
                   for (key, moves), n in sorted(copies.items()) for seed in seeds_of[key]]
    finally:
        env.close()
    return replays, keys, len(entries) - sum(copies.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a training run's folder (config.json, "
                                                  "bank.sqlite)")
    args = parser.parse_args()
    config, bank_file = args.run_dir / "config.json", args.run_dir / "bank.sqlite"
    for needed in (config, bank_file):
        if not needed.is_file():
            parser.error(f"{needed} is missing: give the folder of a training run")

    from crl_envs.errors import UserFacingError
    from crl_harness.config import ConfigError, load_config
    from crl_harness.experience.bank import ExperienceBank

    try:  # a config that is not one, a file that is no bank: one line, no traceback
        cfg = load_config(str(config), [])
        with ExperienceBank(bank_file, read_only=True) as bank:
            entries = bank.entries(cfg.tasks.envs[0].id)
    except (ConfigError, UserFacingError) as err:
        parser.error(str(err))
    replays, keys, other = replay_bank(cfg, entries)
    print(f"{args.run_dir}: {len(entries)} entries of {cfg.tasks.envs[0].id}, {other} not a "
          f"route lesson of a training level")
    for seed, key in keys.items():
        mine = [r for r in replays if r.seed == seed]
        wins = sum(r.won for r in mine)
        print(f"level {seed} ({key}): {len(mine)} distinct lesson(s), {wins} win"
              + ("" if mine else "; none of its own: retrieval hands it another level's"))
        for r in mine:
            print(f"  {'wins ' if r.won else 'loses'}  x{r.copies:<3} votes {r.votes:<3} "
                  f"{', '.join(r.moves)}")
    copies = sum(r.copies for r in replays)
    winning = sum(r.copies for r in replays if r.won)
    print(f"route lessons: {winning}/{copies} entries win when played "
          f"({sum(r.won for r in replays)}/{len(replays)} distinct); levels with a lesson of "
          f"their own: {len({r.seed for r in replays})}/{len(keys)}")


if __name__ == "__main__":
    main()
