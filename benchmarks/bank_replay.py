"""Do a run's lessons work? Every route lesson of a run's bank, played on the training levels
its title names, without a model: which ones win, and which levels have none.

    .venv/bin/python benchmarks/bank_replay.py runs/demo      # RUN_DIR: config.json, bank.sqlite
    .venv/bin/python benchmarks/bank_replay.py runs/demo --set experience.min_query_coverage=0
    .venv/bin/python benchmarks/bank_replay.py runs/demo --key-levels 40   # lessons of a key

A route lesson ("Winning moves from KEY: from the start, play east, south.", as the warm start
teaches the extractor to write it) is played move by move from the reset of each training level
(the run's ``tasks``) whose retrieval key (``info["retrieval_query"]``) is the title's KEY; it
wins when the env reports a win before its moves run out. Printed per training level: its key,
the bank's lessons for it (copies counted once, with how many copies and their votes) and
whether each wins; a level with no lesson of its own gets another level's at retrieval (a
retrieval miss, ``experience_ceiling.py``'s ``wrong`` arm). Other entries are counted apart.
Then what a guided episode of each level is handed now: the env's reset through the
``ExperienceAugmentation`` wrapper and an Experience Manager with the run's retrieval settings
(``experience.k`` and its re-rank; the bank's entries in their order, retrieval counts afresh),
each lesson named as the level's own or another's and played on the level (``--set`` changes
the run's settings first: what other retrieval settings would hand). The bank is opened
read-only (a live run may hold it). Text from the bank reaches the terminal through
``printable``: control characters escaped, each field cut to ``SHOWN_CHARS``.

``--key-levels N`` asks instead whether the bank's lessons transfer: every lesson the env reads
as a policy (``crl_envs.lesson_policy``: a key's sweep, broken off once the goal is in view, or
a route) is played on up to N held-out levels of its key (from ``tasks.heldout_offset`` on,
``--scan`` of them reset to read their keys), beside the env's oracle lesson of the key
(``crl_envs.transferable_lesson``). Printed per key: the oracle's wins, each lesson's wins and
votes, and the lesson a fresh retrieval hands; then the totals over the keys' levels: what
retrieval hands, the key's best lesson, the oracle's.
"""

from __future__ import annotations

import argparse
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHOWN_CHARS = 200
"""the most characters of one bank text (a lesson's moves, a level key) a line shows"""
MAX_KEY_LEVELS = 1000


def printable(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` as a terminal may show it: control, format and unassigned characters (escape
    sequences that retitle or clear a terminal, NUL, bidi overrides, newlines) written as
    Python escapes, and at most ``limit`` characters, then how many were left out.

    >>> printable("south\\x1b[2J\\x00")
    'south\\\\x1b[2J\\\\x00'
    >>> printable("x" * 300, limit=4)
    'xxxx... (296 more characters)'
    """
    head = "".join(char.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(char)[0] == "C" else char for char in text[:limit])
    left_out = len(text) - limit
    return head + (f"... ({left_out} more characters)" if left_out > 0 else "")


@dataclass
class RouteReplay:
    """One distinct route lesson played on one training level (``LessonReplay.wins``)."""

    seed: int
    key: str
    moves: list[str]
    copies: int
    votes: int
    won: bool


def levels_of_keys(keys: dict[int, str | None]) -> dict[str, list[int]]:
    """The training levels of each retrieval key (levels can share one)."""
    seeds_of: dict[str, list[int]] = {}
    for seed, key in keys.items():
        if key:
            seeds_of.setdefault(key, []).append(seed)
    return seeds_of


def replay_bank(cfg: Any, entries: list[Any]) -> tuple[list[RouteReplay], dict[int, str | None],
                                                         int]:
    """The replays of ``entries``' route lessons on the training levels their titles name (one
    env of the config's first entry, reset per level), each training level's retrieval key
    (``None`` where the env gives none), and how many entries are not route lessons of a
    training level."""
    import gymnasium as gym

    import crl_envs  # noqa: F401  (registers the ids)
    from crl_harness.training.lesson_replay import LessonReplay
    from crl_harness.warmstart.routes import route_of

    env_entry = cfg.tasks.envs[0]
    env = gym.make(env_entry.id, **env_entry.kwargs)
    replay = LessonReplay({env_entry.id: dict(env_entry.kwargs)})
    try:
        keys = {seed: env.reset(seed=seed)[1].get("retrieval_query")
                for seed in cfg.tasks.training_seeds()}
        seeds_of = levels_of_keys(keys)
        copies: Counter[tuple[str, tuple[str, ...]]] = Counter()
        votes: Counter[tuple[str, tuple[str, ...]]] = Counter()
        for entry in entries:
            route = route_of(entry)
            if route is not None and route[0] in seeds_of:
                copies[route[0], tuple(route[1])] += 1
                votes[route[0], tuple(route[1])] += entry.votes
        replays = [RouteReplay(seed, key, list(moves), n, votes[key, moves],
                               replay.wins(env_entry.id, seed, moves))
                   for (key, moves), n in sorted(copies.items()) for seed in seeds_of[key]]
    finally:
        env.close()
        replay.close()
    return replays, keys, len(entries) - sum(copies.values())


def memory_copy(entries: list[Any]) -> tuple[Any, list[Any]]:
    """An in-memory bank holding ``entries`` in their order, with their votes (which retrieval
    ranks a key's lessons by), and the copies, one per entry."""
    from crl_harness.experience import ExperienceBank

    bank = ExperienceBank(":memory:")
    copies = [bank.add(e.env_id, e.title, e.content) for e in entries]
    for copy, entry in zip(copies, entries, strict=True):
        if entry.votes > 0:  # a stored entry's votes are never below 0 (it is deleted there)
            bank.vote(copy.id, entry.votes)
    return bank, [bank.get(copy.id) for copy in copies]


@dataclass
class Handed:
    """A lesson retrieval hands a guided episode of a training level, played there."""

    seed: int
    whose: str  # "own", "level N's", "another level's" (not a training level), or "words"
    moves: list[str]
    won: bool | None  # None: not a route lesson


def handed_lessons(cfg: Any, entries: list[Any], keys: dict[int, str | None]) -> list[Handed]:
    """What a guided episode of each training level retrieves from ``entries`` (the run's
    retrieval settings, ``memory_copy``), each lesson played on the level."""
    from crl_harness.experience import ExperienceManager, ManagerConfig
    from crl_harness.rollout import make_env
    from crl_harness.training.lesson_replay import LessonReplay
    from crl_harness.warmstart.routes import route_of

    env_entry = cfg.tasks.envs[0]
    seeds_of = levels_of_keys(keys)
    bank, _ = memory_copy(entries)
    manager = ExperienceManager(bank, config=ManagerConfig.from_config(
        cfg.experience, cfg.exact_key_envs(), seed=cfg.run.seed))
    env = make_env(env_entry.id, manager, cfg.experience.k, **env_entry.kwargs)
    replay = LessonReplay({env_entry.id: dict(env_entry.kwargs)})
    handed = []
    try:
        for seed in keys:
            _, info = env.reset(seed=seed, options={"use_experience": True})
            for entry_id in info.get("experience_ids") or []:
                route = route_of(bank.get(entry_id))
                if route is None:
                    handed.append(Handed(seed, "words", [], None))
                    continue
                key, moves = route
                whose = ("own" if seed in seeds_of.get(key, []) else
                         f"level {seeds_of[key][0]}'s" if key in seeds_of else "another level's")
                # replayed on a bare env, not retrieving again: a retrieval counts in the re-rank
                handed.append(Handed(seed, whose, moves, replay.wins(env_entry.id, seed, moves)))
    finally:
        env.close()
        replay.close()
        manager.close()
        bank.close()
    return handed


@dataclass
class KeyReplay:
    """The lessons of one retrieval key played on unseen levels of that key."""

    key: str
    levels: int
    oracle_wins: int | None  # None: the env writes no oracle lesson for the key
    lessons: list[tuple[str, int, int]]  # (text, votes, wins), in the bank's order
    handed: int | None  # the index in ``lessons`` a fresh retrieval hands, None: nothing


def replay_on_key_levels(cfg: Any, entries: list[Any], per_key: int,
                         scan: int) -> list[KeyReplay]:
    """Each key's lessons among ``entries`` (those that hold every word of the key and state a
    policy the env reads) played on up to ``per_key`` held-out levels of the key, found among
    the first ``scan`` held-out levels; the oracle lesson of the key on the same levels; and
    which lesson a guided episode of the key's first such level is handed (the run's
    retrieval settings, ``memory_copy``)."""
    import gymnasium as gym

    import crl_envs
    from crl_harness.experience import ExperienceManager, ManagerConfig
    from crl_harness.rollout import make_env
    from crl_harness.training.lesson_replay import LessonReplay

    env_entry = cfg.tasks.envs[0]
    steps = int(env_entry.kwargs.get("max_episode_steps", 0)) or None
    bank, copies = memory_copy(entries)
    policies = [copy for copy in copies  # the lessons that state a policy the env reads
                if crl_envs.lesson_policy(env_entry.id, copy.content) is not None]
    manager = ExperienceManager(bank, config=ManagerConfig.from_config(
        cfg.experience, cfg.exact_key_envs(), seed=cfg.run.seed))
    guided = make_env(env_entry.id, manager, cfg.experience.k, **env_entry.kwargs)
    env = gym.make(env_entry.id, **env_entry.kwargs)
    replay = LessonReplay({env_entry.id: dict(env_entry.kwargs)})
    try:
        levels: dict[str, list[int]] = {}
        offset = cfg.tasks.heldout_offset
        for seed in range(offset, offset + scan):
            key = str(env.reset(seed=seed)[1].get("retrieval_query") or "")
            if key and len(levels.setdefault(key, [])) < per_key:
                levels[key].append(seed)
        results = []
        for key, seeds in levels.items():
            # a lesson of the key as retrieval's coverage floor tells it
            own = [copy for copy in policies if manager.retriever.is_own(env_entry.id, key, copy)]
            if not own:
                continue
            oracle = crl_envs.transferable_lesson(env_entry.id, key, steps) if steps else None
            oracle_wins = None if oracle is None else sum(
                bool(replay.wins_following(env_entry.id, s, oracle[1])) for s in seeds)
            lessons = [(e.content, e.votes,
                        sum(bool(replay.wins_following(env_entry.id, s, e.content))
                            for s in seeds)) for e in own]
            shown = guided.reset(seed=seeds[0], options={"use_experience": True})[1]
            handed = next((n for n, e in enumerate(own)
                           if e.id in (shown.get("experience_ids") or [])), None)
            results.append(KeyReplay(key, len(seeds), oracle_wins, lessons, handed))
    finally:
        guided.close()
        env.close()
        replay.close()
        manager.close()
        bank.close()
    return results


def print_key_replays(results: list[KeyReplay]) -> None:
    """Per key, then the totals over the keys' levels (each key weighs its levels)."""
    handed = best = oracle = levels = 0
    for r in sorted(results, key=lambda r: -r.levels):
        said = "no oracle lesson" if r.oracle_wins is None else f"oracle {r.oracle_wins}"
        print(f"key {printable(r.key)}: {r.levels} unseen levels, {said}")
        for n, (text, votes, wins) in enumerate(r.lessons):
            mark = "handed" if n == r.handed else "      "
            print(f"  {mark} {wins:>4}/{r.levels:<4} votes {votes:<3} {printable(text)}")
        levels += r.levels
        handed += r.lessons[r.handed][2] if r.handed is not None else 0
        best += max(wins for _, _, wins in r.lessons)
        oracle += r.oracle_wins or 0
    print(f"{len(results)} keys, {levels} unseen levels of them: the lesson retrieval hands "
          f"wins {handed}, the key's best lesson {best}, the oracle's lesson {oracle}")


def main() -> None:
    from crl_harness.config import HELDOUT_RESERVED as MAX_SCAN  # the held-out levels there are

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a training run's folder (config.json, "
                                                  "bank.sqlite)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="key=value",
                        help="overrides of the run's config, e.g. experience.min_query_coverage=1")
    parser.add_argument("--key-levels", type=int, default=None, metavar="N",
                        help=f"play each lesson on up to N unseen levels of its key "
                             f"(1..{MAX_KEY_LEVELS}) instead")
    parser.add_argument("--scan", type=int, default=4000,
                        help=f"held-out levels --key-levels resets to find them (1..{MAX_SCAN})")
    args = parser.parse_args()
    if args.key_levels is not None and not 1 <= args.key_levels <= MAX_KEY_LEVELS:
        parser.error(f"--key-levels must be in 1..{MAX_KEY_LEVELS}")
    if not 1 <= args.scan <= MAX_SCAN:
        parser.error(f"--scan must be in 1..{MAX_SCAN}")
    config, bank_file = args.run_dir / "config.json", args.run_dir / "bank.sqlite"
    for needed in (config, bank_file):
        if not needed.is_file():
            parser.error(f"{needed} is missing: give the folder of a training run")

    from crl_envs.errors import UserFacingError
    from crl_harness.config import ConfigError, load_config
    from crl_harness.experience.bank import ExperienceBank

    try:  # a config that is not one, a file that is no bank: one line, no traceback
        cfg = load_config(str(config), args.set)
        with ExperienceBank(bank_file, read_only=True) as bank:
            entries = bank.entries(cfg.tasks.envs[0].id)
    except (ConfigError, UserFacingError) as err:
        parser.error(str(err))
    if args.key_levels is not None:
        print(f"{args.run_dir}: {len(entries)} entries of {cfg.tasks.envs[0].id}")
        print_key_replays(replay_on_key_levels(cfg, entries, args.key_levels, args.scan))
        return
    replays, keys, other = replay_bank(cfg, entries)
    print(f"{args.run_dir}: {len(entries)} entries of {cfg.tasks.envs[0].id}, {other} not a "
          f"route lesson of a training level")
    for seed, key in keys.items():
        mine = [r for r in replays if r.seed == seed]
        wins = sum(r.won for r in mine)
        print(f"level {seed} ({printable(str(key))}): {len(mine)} distinct lesson(s), {wins} win"
              + ("" if mine else "; none of its own"))
        for r in mine:
            print(f"  {'wins ' if r.won else 'loses'}  x{r.copies:<3} votes {r.votes:<3} "
                  f"{printable(', '.join(r.moves))}")
    handed = handed_lessons(cfg, entries, keys)
    for seed in keys:
        mine = [h for h in handed if h.seed == seed]
        for h in mine:
            outcome = "a lesson in words" if h.won is None else (
                f"{h.whose} {printable(', '.join(h.moves))}: {'wins' if h.won else 'loses'}")
            print(f"level {seed} retrieves {outcome}")
        if not mine:
            print(f"level {seed} retrieves nothing")
    copies = sum(r.copies for r in replays)
    winning = sum(r.copies for r in replays if r.won)
    print(f"route lessons: {winning}/{copies} entries win when played "
          f"({sum(r.won for r in replays)}/{len(replays)} distinct); levels with a lesson of "
          f"their own: {len({r.seed for r in replays})}/{len(keys)}; levels handed their own "
          f"lesson: {len({h.seed for h in handed if h.whose == 'own'})}/{len(keys)}, one that "
          f"wins there: {len({h.seed for h in handed if h.won})}/{len(keys)}, nothing: "
          f"{len(set(keys) - {h.seed for h in handed})}/{len(keys)}")


if __name__ == "__main__":
    main()
