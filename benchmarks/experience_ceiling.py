"""The experience ceiling: how much can the right lesson help the warm actor, and what does a
wrong one cost? The gap bounds what any arm comparison can show at this scale.

    .venv/bin/python benchmarks/experience_ceiling.py                  # cpu-demo, 32 levels x 2
    .venv/bin/python benchmarks/experience_ceiling.py --levels 16 --episodes-per-level 4

On ``--levels`` pool levels whose retrieval keys differ (the ``distinct`` pool of
``benchmarks/retrieval_oracle.py``, from ``tasks.seed_offset`` on), the actor (``--model``,
default the config's warm start) plays each level ``--episodes-per-level`` times in each of three
arms, at the training temperature, the system prompt built as in training:
- ``free``: no experience;
- ``own``: the level's own oracle lesson (the route an earlier, unhurried run of the scripted
  oracle found, written as the warm start teaches the extractor to write it), handed to the
  episode as retrieved experience: retrieval is taken as perfect here (that it finds the lesson
  is ``retrieval_oracle.py``'s question);
- ``wrong``: the lesson of another pool level (the next one in the pool), as a retrieval miss
  would hand it.
The j-th episode of a level in one arm is paired with its j-th in another: success rates with
95% Wilson intervals, how many played the lesson's whole route, and own - free and wrong - free
as paired differences with their 95% intervals and McNemar's exact p. Levels where the unhurried oracle does not win have no lesson
and are left out. One batch per arm, all arms with the same sampling seed.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class LessonByLevel:
    """A retriever that hands each episode the lesson of the level ``pick`` chooses for it, found
    by the episode's retrieval key (the pool's keys differ)."""

    lessons: dict[int, Any]
    level_of_key: dict[str, int]
    pick: dict[int, int]

    def retrieve(self, env_id: str, query: str, k: int) -> list[Any]:
        level = self.level_of_key.get(query)
        return [self.lessons[self.pick[level]]] if level in self.pick else []


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--model", help="actor spec (default: the actor the config starts from)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--levels", type=int, default=32, help="pool levels (2..256)")
    parser.add_argument("--episodes-per-level", type=int, default=2, help="per arm (1..16)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed, the same in each arm")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides, e.g. actor.temperature=0.7")
    args = parser.parse_args()
    for name, low, high in (("levels", 2, 256), ("episodes_per_level", 1, 16)):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name.replace('_', '-')} must be in {low}..{high}")

    from crl_harness.eval import format_paired, paired_difference, wilson_interval
    from crl_harness.models import load_backend
    from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    sys_path_benchmarks()
    from retrieval_oracle import config_and_pools, lessons, oracle_play

    cfg, pool, key_of = config_and_pools(parser, args)
    entry, seeds = cfg.tasks.envs[0], pool["distinct"]

    routes = lessons(entry.id, seeds, oracle_play(cfg))
    levels = [s for s in seeds if s in routes]
    if len(levels) < 2:
        raise SystemExit(f"only {len(levels)} pool level(s) have an oracle lesson; ask for more "
                         "--levels")
    level_of_key = {key_of[s]: s for s in levels}
    arms = {"free": {}, "own": {s: s for s in levels},
            "wrong": {s: levels[(i + 1) % len(levels)] for i, s in enumerate(levels)}}

    model = args.model or cfg.starting_model()
    backend = load_backend(model, dtype=args.dtype)
    rollout = RolloutConfig.from_config(cfg, max_live=len(levels) * args.episodes_per_level,
                                        workers=1, seed=args.seed, k=1, actor_critic_gate=False,
                                        search_and_ask=False,
                                        env_kwargs={entry.id: dict(entry.kwargs)})
    print(f"{args.config}: {entry.id} {entry.kwargs}; {model} ({args.dtype}); {len(levels)} "
          f"levels with a lesson of {len(seeds)}, {args.episodes_per_level} episode(s) a level "
          f"an arm, temperature {cfg.actor.temperature}")
    won: dict[str, list[bool]] = {}
    for arm, pick in arms.items():
        start = time.perf_counter()
        engine = RolloutEngine(backend, retriever=LessonByLevel(routes, level_of_key, pick),
                               config=rollout)
        specs = [EpisodeSpec(entry.id, seed, group_id=i, use_experience=arm != "free")
                 for i, seed in enumerate(s for s in levels for _ in range(args.episodes_per_level))]
        try:
            trajectories = sorted(engine.run(specs), key=lambda t: t.group_id)
        finally:
            engine.close()
        won[arm] = [bool(t.won) and not t.error for t in trajectories]
        wins, n = sum(won[arm]), len(won[arm])
        low, high = wilson_interval(wins, n)
        retrieved = sum(bool(t.experience_ids) for t in trajectories)
        # played the lesson's route to its end (the own lesson's wins; another level's mostly not)
        followed = sum(_played_route(t, routes[pick[t.seed]]) for t in trajectories
                       if t.seed in pick)
        played = f", played its whole route: {followed}/{n}" if pick else ""
        print(f"{arm:<6} {wins:>3}/{n:<3} {wins / n:6.1%} [{low:.1%}, {high:.1%}]  "
              f"with a lesson: {retrieved}/{n}{played}  ({time.perf_counter() - start:.0f} s)")
    for arm in ("own", "wrong"):
        print(f"{arm} - free: {format_paired(paired_difference(won['free'], won[arm]), 'free', arm)}")


def _played_route(trajectory, lesson) -> bool:
    """Whether the episode's first moves are the whole route of ``lesson`` ("from the start,
    play east, south.")."""
    from crl_harness.warmstart.routes import route_of

    route = route_of(lesson)[1]
    return [t.action for t in trajectory.turns[:len(route)]] == route


def sys_path_benchmarks() -> None:
    """Make the sibling benchmarks importable (``retrieval_oracle``'s pool and lessons)."""
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)


if __name__ == "__main__":
    main()
