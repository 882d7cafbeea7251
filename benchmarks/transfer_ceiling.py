"""The ceiling of transferable lessons: how much does a lesson that holds for every level of a
retrieval key lift the warm actor on levels it has never played?

    .venv/bin/python benchmarks/transfer_ceiling.py                      # cpu-demo, 96 levels
    .venv/bin/python benchmarks/transfer_ceiling.py --samples 4 --set actor.rollout_engine=vllm

On ``--levels`` unseen levels of the config's first env (from ``--offset``, by default
``UNSEEN_OFFSET``: apart from the training pools, the warm start's levels and the held-out
levels), each level is handed the env oracle's transferable lesson for its retrieval key
(``crl_envs.transferable_lesson``: in a dark MiniHack Room the best sweep from the start cell,
broken off for the stairs once they are in view), as retrieved experience in the form the warm
start teaches (retrieval taken as perfect: the key holds the start cell). The actor (``--model``,
default the config's warm start) plays every level greedily free and shown the lesson (the two
paired level by level), and ``--samples`` more times in each case at its training temperature
(the j-th sample of a level paired with its j-th in the other case). Printed: each case's
success with its 95% Wilson interval, shown - free as a paired difference with its 95% interval
and McNemar's exact p, how closely the shown episodes played the lesson (their moves against
the lesson's policy: at every turn, and on the turns the stairs were in view), and the lesson's
own win rate played without a model (``LessonReplay.wins_following``) on the same levels: the
ceiling of the ceiling. A report goes to ``--out/transfer_ceiling.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_LEVELS = 1000
MAX_SAMPLES = 16


@dataclass
class LessonsByKey:
    """A retriever that hands an episode the lesson of its retrieval key (none where the env's
    oracle writes none)."""

    lessons: dict[str, Any]

    def retrieve(self, env_id: str, query: str, k: int) -> list[Any]:
        lesson = self.lessons.get(query)
        return [lesson][:k] if lesson is not None else []


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--model", help="actor spec (default: the actor the config starts from)")
    parser.add_argument("--dtype", default=None, help="the actor's weights (default actor.dtype)")
    parser.add_argument("--levels", type=int, default=96, help=f"unseen levels (2..{MAX_LEVELS})")
    parser.add_argument("--offset", type=int, default=None,
                        help="the first unseen level (default UNSEEN_OFFSET)")
    parser.add_argument("--samples", type=int, default=0,
                        help=f"sampled episodes a level a case besides the greedy one "
                             f"(0..{MAX_SAMPLES})")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed, the same in each case")
    parser.add_argument("--out", type=Path, default=Path("runs/transfer-ceiling"))
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides, e.g. actor.rollout_engine=vllm")
    args = parser.parse_args()
    if not 2 <= args.levels <= MAX_LEVELS:
        parser.error(f"--levels must be in 2..{MAX_LEVELS}")
    if not 0 <= args.samples <= MAX_SAMPLES:
        parser.error(f"--samples must be in 0..{MAX_SAMPLES}")

    from crl_harness.config import ConfigError, load_config
    from crl_harness.training.unseen import UNSEEN_OFFSET

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as err:
        parser.error(str(err))
    offset = UNSEEN_OFFSET if args.offset is None else args.offset
    if not 0 <= offset <= 2**31 - args.levels:
        parser.error(f"--offset must be in 0..{2**31 - args.levels}")
    entry = cfg.tasks.envs[0]
    lessons, keys = oracle_lessons(entry, list(range(offset, offset + args.levels)))
    if not lessons:
        parser.error(f"the oracle of {entry.id} writes no transferable lesson "
                     "(crl_envs.transferable_lesson)")
    run(cfg, args, entry, lessons, keys)


def oracle_lessons(entry: Any, seeds: list[int]) -> tuple[dict[str, Any], dict[int, str]]:
    """The oracle's transferable lesson of every retrieval key among ``seeds`` of the env
    ``entry`` (a ``tasks.envs`` entry, within its step limit), as experience entries; and each
    level's key."""
    import gymnasium as gym

    import crl_envs
    from crl_harness.experience.entries import ExperienceEntry

    env = gym.make(entry.id, **dict(entry.kwargs))
    try:
        steps = env.spec.max_episode_steps
        keys = {}
        for seed in seeds:
            _, info = env.reset(seed=seed, options=dict(entry.options) or None)
            keys[seed] = info.get("retrieval_query") or info["task"]
    finally:
        env.close()
    lessons = {}
    for i, key in enumerate(sorted(set(keys.values()))):
        written = crl_envs.transferable_lesson(entry.id, key, steps)
        if written is not None:
            lessons[key] = ExperienceEntry(f"transfer-{i}", entry.id, *written)
    return lessons, keys


def run(cfg: Any, args: argparse.Namespace, entry: Any, lessons: dict[str, Any],
        keys: dict[int, str]) -> None:
    from crl_harness.eval import evaluate, format_paired, format_rate, paired_difference
    from crl_harness.eval.heldout import load_actor
    from crl_harness.rollout import EpisodeSpec, RolloutConfig
    from crl_harness.training.lesson_replay import LessonReplay

    seeds = sorted(keys)
    shown_levels = [s for s in seeds if keys[s] in lessons]
    replay = LessonReplay({entry.id: dict(entry.kwargs)}, {entry.id: dict(entry.options)})
    try:
        replayed = {s: bool(replay.wins_following(entry.id, s, _text(lessons[keys[s]])))
                    for s in shown_levels}
    finally:
        replay.close()

    model = args.model or cfg.starting_model()
    dtype = args.dtype or cfg.actor.dtype
    started = time.perf_counter()
    backend = load_actor(cfg, model, dtype)
    retriever = LessonsByKey(lessons)
    settings = dict(max_live=64, workers=1, actor_critic_gate=False, search_and_ask=False)
    plays = {"greedy": (RolloutConfig.from_config(cfg, temperature=0.0, **settings), 1)}
    if args.samples:
        plays["sampled"] = (RolloutConfig.from_config(cfg, seed=args.seed, **settings),
                            args.samples)
    won: dict[str, dict[str, list[bool]]] = {}
    agreement: dict[str, list[int]] = {}
    try:
        for how, (rollout, repeats) in plays.items():
            specs = [EpisodeSpec(entry.id, seed, group_id=i, use_experience=shown,
                                 options=dict(entry.options) or None)
                     for i, (shown, seed) in enumerate(
                         (shown, s) for shown in (False, True) for s in seeds
                         for _ in range(repeats))]
            played = sorted(evaluate(model, specs, backend=backend, retriever=retriever,
                                     rollout=rollout), key=lambda t: t.group_id)
            half = len(played) // 2
            won[how] = {case: [bool(t.won) and not t.error for t in part]
                        for case, part in (("free", played[:half]), ("shown", played[half:]))}
            agreement[how] = _agreement([t for t in played[half:] if t.experience_ids], lessons,
                                        keys)
    finally:
        backend.close()
    seconds = time.perf_counter() - started

    n_replay = len(replayed)
    print(f"{args.config}: {entry.id} {dict(entry.kwargs)}; {model} ({dtype}, "
          f"{cfg.actor.rollout_engine}); {len(seeds)} unseen levels from {seeds[0]}, "
          f"{len(shown_levels)} with an oracle lesson of their key ({len(lessons)} keys); "
          f"{seconds:.0f} s")
    print(f"  the lessons played without a model: {format_rate(sum(replayed.values()), n_replay)}")
    report: dict[str, Any] = {
        "config": args.config, "model": model, "dtype": dtype,
        "engine": cfg.actor.rollout_engine, "levels": seeds, "seconds": seconds,
        "overrides": args.set, "lessons": {k: _text(e) for k, e in lessons.items()},
        "replay_wins": [sum(replayed.values()), n_replay]}
    for how, cases in won.items():
        d = paired_difference(cases["free"], cases["shown"])
        steps, agreed, in_view, agreed_in_view = agreement[how]
        print(f"  {how}: free {format_rate(d.a_wins, d.n)}, shown {format_rate(d.b_wins, d.n)}; "
              f"shown - free {format_paired(d, 'free', 'shown')}")
        print(f"    shown episodes' moves as the lesson's policy says: {agreed}/{steps} turns; "
              f"with the stairs in view: {agreed_in_view}/{in_view}")
        report[how] = {**d.to_dict(), "turns_as_lesson": [agreed, steps],
                       "turns_as_lesson_goal_in_view": [agreed_in_view, in_view]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transfer_ceiling.json").write_text(json.dumps(report, indent=2))


def _text(lesson: Any) -> str:
    """A lesson as the actor reads it: its title, then its content."""
    return f"{lesson.title}: {lesson.content}"


def _agreement(trajectories: list[Any], lessons: dict[str, Any],
               keys: dict[int, str]) -> list[int]:
    """Turns of ``trajectories`` (shown a lesson) whose move is the one the lesson's policy
    (``crl_envs.lesson_policy``) says for that turn's observation (its next move, or the walk to
    the stairs once they are in view), in all and where MiniHack's stairs were in view: [turns,
    agreed, turns with the stairs in view, agreed of those]; until the lesson says no more."""
    import crl_envs
    from crl_envs.minihack.oracle import parse_observation

    counts = [0, 0, 0, 0]
    for traj in trajectories:
        policy = crl_envs.lesson_policy(traj.env_id, _text(lessons[keys[traj.seed]]))
        for turn in traj.turns:
            said = policy(turn.observation) if policy is not None else None
            if said is None:
                break
            view = parse_observation(turn.observation)
            in_view = view is not None and bool(view.find(">"))
            agreed = turn.action == said
            counts[0] += 1
            counts[1] += agreed
            counts[2] += in_view
            counts[3] += agreed and in_view
    return counts


if __name__ == "__main__":
    main()
