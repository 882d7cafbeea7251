"""Extractor quality: does the warm extractor write the lesson its warm start teaches?

    .venv/bin/python benchmarks/extractor_quality.py              # cpu-demo, 48 episodes
    .venv/bin/python benchmarks/extractor_quality.py --extractor hf:RUN/checkpoints/.../extractor_hf
    .venv/bin/python benchmarks/extractor_quality.py --dtype float32 --set extractor.rollout_engine=vllm
    .venv/bin/python benchmarks/extractor_quality.py --replay-levels 8 --set warmstart.extractor_lesson=key
    .venv/bin/python benchmarks/extractor_quality.py --merge-cases 64 --set warmstart.extractor_lesson=key

On the config's first env and held-out levels (``tasks.heldout_offset``, never in a warm start)
the scripted oracle plays the episodes the warm start teaches from
(``crl_harness.warmstart.data.extractor_episodes``, with ``warmstart.noise``), shared over the
answers as the warm start shares them (48: 12 add, 8 return, 4 misled returns, 12 upvote, 12
downvote; with key lessons half add: 24 add, 6 return, 2 misled, 8 upvote, 8 downvote); for each, the Experience Manager's own distillation prompt (with the entry the episode
was shown, if any) goes to the extractor, greedy and at the config's ``extractor.temperature``
(the one training samples at, ``--samples`` answers each). The cases and what is taught
(``taught_answer``):

- ``add``: a won episode (no entry, or another level's set aside) adds its own route (with
  ``--set warmstart.extractor_lesson=key``: the env's transferable lesson of its key, and the
  votes judge episodes that followed such lessons, as that warm start teaches);
- ``return``: a lost one (no entry, or another level's set aside) changes nothing;
- ``return, misled``: a lost episode that followed another level's route changes nothing (the
  route is right for its own level);
- ``upvote``: a won episode that followed its own level's lesson upvotes it;
- ``downvote``: a lost episode that followed a wrong lesson of its own level downvotes it.

Each answer is counted as malformed (the strict parser rejects it: nothing is written), right
(exactly the taught operations) or other (well-formed, anything else). Printed per case with 95%
Wilson intervals; the bank of a training run holds what this measures.

With ``--replay-levels N`` the lesson each greedy answer to an ``add`` case adds is replayed
without a model (``LessonReplay.wins_following``: the policy the lesson states) on N unseen
levels of the episode's retrieval key (found by resetting levels from ``tasks.heldout_offset +
REPLAY_SEED_OFFSET`` and reading ``info["retrieval_query"]``), beside the oracle's transferable
lesson of the key (``crl_envs.transferable_lesson``) on the same levels: their win rates and
ratio say whether the extractor's lessons transfer as the oracle's do. An answer that adds no
lesson a policy reads loses its levels; a key the env writes no lesson for is left out.

With ``--actor-episodes N`` the extractor also answers a frozen set of transcripts the actor
played, not the oracle: the config's starting actor plays N held-out levels (from
``tasks.heldout_offset + ACTOR_SEED_OFFSET``) shown no lesson, sampled at ``actor.temperature``
with the seed ``run.seed`` (the same actor, engine and seed give the same set; its fingerprint
is printed and kept). These are the transcripts training distils. The taught answer is as
above: a won episode adds its own lesson (the key's, with ``extractor_lesson`` ``key``), a lost
one returns (rows ``actor: add`` and ``actor: return``); with ``--replay-levels`` the greedy adds
of the won ones are replayed beside the oracle's lesson as well. Why both: an extractor that
copied what was played would look right on the oracle's episodes and wrong on the actor's.

With ``--merge-cases N`` (key lessons only) the extractor also answers N chunks of lessons in the
merge pass's prompt, drawn as ``warmstart.extractor_merges`` draws them over the keys of unseen
levels (``crl_harness.warmstart.merges``): rows ``merge`` (a key's lessons, its own and
miscopies, to fold into the key's lesson) and ``merge: return`` (distinct keys, left alone);
with ``--replay-levels`` the lesson each greedy fold writes is replayed beside the oracle's.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

CASES = ("add", "return", "return, misled", "upvote", "downvote")
ACTOR_CASES = ("actor: add", "actor: return")
"""the rows of the actor's episodes (``--actor-episodes``): shown nothing, they add or return"""
REPLAY_SEED_OFFSET = 100_000
"""replay levels start this far past ``tasks.heldout_offset``: past the episodes' levels"""
REPLAY_SCAN = 400
"""levels reset per replay level asked, at most, to find the keys' levels (a start cell with
nothing in view is about one level in 40; a key that shows the stairs, one in 600)"""
ACTOR_SEED_OFFSET = 200_000
"""the actor's episodes (``--actor-episodes``) start this far past ``tasks.heldout_offset``: past
the taught cases' levels and the replay levels"""
MAX_ACTOR_EPISODES = 512
MAX_MERGE_CASES = 256
MERGE_CASES = ("merge", "merge: return")
"""the rows of ``--merge-cases``: a chunk with a key's lessons folded into the key's lesson, and
a chunk of distinct keys left alone"""


def case_of(episode) -> str:
    """The row of ``CASES`` an ``AdvisedEpisode`` is counted in (its ``answer_case``)."""
    from crl_harness.warmstart.data import answer_case

    case = answer_case(episode)
    return "return, misled" if case == "misled" else case


def heldout_episodes(cfg, backend, count: int) -> list:
    """``count`` episodes balanced over the answer classes, on held-out levels."""
    from crl_harness.warmstart.data import extractor_episodes

    env = cfg.tasks.envs[0]
    seeds = list(range(cfg.tasks.heldout_offset, cfg.tasks.heldout_offset + 50 * count))
    episodes = extractor_episodes(env.id, seeds, count, noise=cfg.warmstart.noise,
                                  rng=random.Random(cfg.tasks.heldout_offset),
                                  lesson=cfg.warmstart.extractor_lesson,
                                  tokenizer=backend.tokenizer, max_context=backend.max_context,
                                  max_new_tokens=cfg.actor.max_new_tokens,
                                  history=cfg.actor.history, env_kwargs=env.kwargs,
                                  options=env.options or None)
    if len(episodes) < count:
        raise SystemExit(f"the oracle gave {len(episodes)} of {count} episodes in {len(seeds)} "
                         "held-out levels; ask for fewer")
    return episodes


def actor_episodes(cfg, count: int, dtype: str) -> tuple[list, str]:
    """``count`` episodes of the config's starting actor on held-out levels from
    ``tasks.heldout_offset + ACTOR_SEED_OFFSET``, shown no lesson, sampled at
    ``actor.temperature`` with the seed ``run.seed``, as ``AdvisedEpisode`` objects whose ``add``
    teaches the lesson the warm start would (``warmstart.extractor_lesson``); and the
    fingerprint of their transcripts and replies (equal fingerprints: the same frozen set)."""
    import hashlib
    from contextlib import closing

    from crl_harness.eval import evaluate
    from crl_harness.eval.heldout import load_actor
    from crl_harness.rollout import EpisodeSpec, RolloutConfig
    from crl_harness.warmstart.data import AdvisedEpisode
    from crl_harness.warmstart.lessons import KeyLessons

    entry = cfg.tasks.envs[0]
    start = cfg.tasks.heldout_offset + ACTOR_SEED_OFFSET
    specs = [EpisodeSpec(entry.id, seed, group_id=i, options=dict(entry.options) or None)
             for i, seed in enumerate(range(start, start + count))]
    rollout = RolloutConfig.from_config(cfg, actor_critic_gate=False, search_and_ask=False,
                                        max_live=64, seed=cfg.run.seed)
    backend = load_actor(cfg, cfg.starting_model(), dtype)
    try:
        played = evaluate(cfg.starting_model(), specs, backend=backend, rollout=rollout)
    finally:
        backend.close()
    played = sorted((t for t in played if not t.error), key=lambda t: t.seed)
    keyed = cfg.warmstart.extractor_lesson == "key"
    with closing(KeyLessons(entry.id, dict(entry.kwargs), dict(entry.options) or None)) as lessons:
        episodes = [AdvisedEpisode(t, None, followed=False,
                                   own=lessons(t.seed) if keyed else None) for t in played]
    # the replies too: two sets of transcripts can read alike where every reply failed the format
    digest = hashlib.sha256("\n".join(t.transcript + "".join(turn.text for turn in t.turns)
                                      for t in played).encode()).hexdigest()[:12]
    return episodes, digest


def taught(episode, cfg) -> tuple[str, tuple]:
    """The distillation prompt of ``episode`` (what the Experience Manager sends) and the
    operations the warm start teaches for it."""
    from crl_harness.experience.operations import ParseLimits, parse_distillation
    from crl_harness.warmstart.data import extractor_prompt, taught_answer

    prompt = extractor_prompt(episode, max_ops=ParseLimits().max_ops,
                              max_transcript_chars=cfg.experience.max_transcript_chars)
    return prompt, parse_distillation(taught_answer(episode), int(episode.advice is not None)).ops


def verdict(answer: str, shown: int, ops: tuple) -> str:
    """``malformed``, ``right`` (the taught ``ops``) or ``other``; ``shown`` entries numbered."""
    from crl_harness.experience.operations import parse_distillation

    parsed = parse_distillation(answer, shown)
    if not parsed.ok:
        return "malformed"
    return "right" if parsed.ops == ops else "other"


def added_lesson(answer: str, shown: int) -> str | None:
    """The text ("title: content") of the first lesson ``answer`` adds; None if it adds none
    (or is malformed)."""
    from crl_harness.experience.operations import Add, parse_distillation

    parsed = parse_distillation(answer, shown)
    add = next((op for op in parsed.ops if isinstance(op, Add)), None) if parsed.ok else None
    return None if add is None else f"{add.title}: {add.content}"


def levels_of_keys(cfg, keys: set[str], count: int) -> dict[str, list[int]]:
    """Up to ``count`` levels of each retrieval key of ``keys`` among the levels from
    ``tasks.heldout_offset + REPLAY_SEED_OFFSET`` (at most ``REPLAY_SCAN * count`` reset)."""
    import gymnasium as gym

    import crl_envs  # noqa: F401  (registers the ids)

    entry = cfg.tasks.envs[0]
    found: dict[str, list[int]] = {key: [] for key in keys}
    start = cfg.tasks.heldout_offset + REPLAY_SEED_OFFSET
    env = gym.make(entry.id, **entry.kwargs)
    try:
        for seed in range(start, start + REPLAY_SCAN * count):
            if all(len(seeds) >= count for seeds in found.values()):
                break
            key = env.reset(seed=seed, options=entry.options or None)[1].get("retrieval_query")
            if key in found and len(found[key]) < count:
                found[key].append(seed)
    finally:
        env.close()
    return found


def replay_lessons(cfg, added: list[tuple[str, str | None]], count: int) -> dict:
    """Replay each ``(key, lesson text or None)`` of ``added`` and the oracle's transferable
    lesson of the key on up to ``count`` unseen levels of the key (``levels_of_keys``);
    return the levels played and each side's wins."""
    import gymnasium as gym

    import crl_envs
    from crl_harness.training.lesson_replay import LessonReplay

    entry = cfg.tasks.envs[0]
    steps = entry.kwargs.get("max_episode_steps") or gym.spec(entry.id).max_episode_steps
    oracle = {key: crl_envs.transferable_lesson(entry.id, key, steps) for key, _ in added}
    levels = levels_of_keys(cfg, {key for key, _ in added if oracle[key]}, count)
    replay = LessonReplay({entry.id: dict(entry.kwargs)}, {entry.id: dict(entry.options)})
    out = {"cases": len(added), "keyed": 0, "unread": 0, "levels": 0, "extractor_wins": 0,
           "oracle_wins": 0}
    try:
        # the oracle's lesson of a key wins the same levels for every case of that key
        oracle_wins = {key: sum(bool(replay.wins_following(entry.id, seed, ": ".join(lesson)))
                                for seed in levels[key])
                       for key, lesson in oracle.items() if lesson and levels.get(key)}
        for key, text in added:
            if key not in oracle_wins:
                continue
            out["keyed"] += 1
            wins = [replay.wins_following(entry.id, seed, text) if text else None
                    for seed in levels[key]]
            out["unread"] += wins[0] is None  # the same text reads the same on every level
            out["levels"] += len(levels[key])
            out["extractor_wins"] += sum(bool(won) for won in wins)
            out["oracle_wins"] += oracle_wins[key]
    finally:
        replay.close()
    return out


def ask_merges(cfg, backend, count: int, samples: int, replay_levels: int = 0) -> dict:
    """``count`` merge-pass chunks (``crl_harness.warmstart.merges.merge_cases``, over the keys
    of the levels from ``tasks.heldout_offset + REPLAY_SEED_OFFSET``) in the manager's merge
    prompt, answered greedy and ``samples`` times at ``extractor.temperature``; each answer
    right (exactly the taught operations: the key's lessons folded into its lesson, or none),
    other or malformed (``parse_merge`` rejects it); printed and returned as ``_ask``'s rows.
    With ``replay_levels`` the lesson each greedy answer to a folding chunk merges into (its
    first ``merge``; none: it loses) is replayed on that many unseen levels of the key beside the
    oracle's lesson (``replay_lessons``, key ``merge replay``)."""
    from crl_harness.experience.manager_config import ManagerConfig
    from crl_harness.experience.operations import Merge, parse_merge
    from crl_harness.warmstart.merges import merge_cases, merge_prompt, taught_merge

    entry = cfg.tasks.envs[0]
    start = cfg.tasks.heldout_offset + REPLAY_SEED_OFFSET
    cases = merge_cases(entry.id, range(start, start + REPLAY_SCAN), count,
                        rng=random.Random(cfg.tasks.heldout_offset),
                        chunk=ManagerConfig().merge_chunk, env_kwargs=dict(entry.kwargs),
                        options=dict(entry.options) or None)
    prompts = [[{"role": "user", "content": merge_prompt(case)}] for case in cases]
    taught = [parse_merge(taught_merge(case), len(case.shown)).ops for case in cases]
    results: dict[str, dict] = {}
    merged: list[tuple[str, str | None]] = []  # the greedy folds: key, lesson merged into
    for label, temperature, repeats in (("greedy", 0.0, 1),
                                        (f"T={cfg.extractor.temperature}",
                                         cfg.extractor.temperature, samples)):
        started = time.perf_counter()
        counts = {case: {"right": 0, "other": 0, "malformed": 0} for case in MERGE_CASES}
        examples = []
        for _ in range(repeats):
            answers = backend.generate(prompts, max_new_tokens=cfg.extractor.max_new_tokens,
                                       temperature=temperature, top_p=cfg.extractor.top_p)
            for case, answer, ops in zip(cases, answers, taught, strict=True):
                row = MERGE_CASES[case.lesson is None]
                parsed = parse_merge(answer.text, len(case.shown))
                kind = "malformed" if not parsed.ok else "right" if parsed.ops == ops else "other"
                counts[row][kind] += 1
                if kind != "right" and len(examples) < 3:
                    examples.append(f"{row}: {answer.text[:150]!r}")
                if temperature == 0.0 and case.lesson is not None:
                    merge = next((op for op in parsed.ops if isinstance(op, Merge)), None)
                    merged.append((case.key, None if merge is None
                                   else f"{merge.title}: {merge.content}"))
        results[label] = {"counts": counts, "seconds": time.perf_counter() - started}
        print_counts(label, counts, examples)
    if replay_levels and merged:
        results["merge replay"] = replayed = replay_lessons(cfg, merged, replay_levels)
        print_replay("merge", replayed, replay_levels)
    return results


def measure(cfg, extractor: str, dtype: str, count: int, samples: int,
            replay_levels: int = 0, actor_count: int = 0, merge_count: int = 0) -> dict:
    """Play ``count`` episodes of the taught cases on ``cfg``'s held-out levels and ask
    ``extractor`` (a model spec) for each one's operations, greedy and ``samples`` times at
    ``cfg.extractor.temperature``; print and return, per label and case, how many answers were
    right, other and malformed; with ``replay_levels``, also the replay of the greedy answers'
    added lessons (``replay_lessons``); with ``actor_count``, the same for that many episodes
    the actor played (``actor_episodes``), played first, before the extractor's engine starts;
    with ``merge_count``, that many merge-pass chunks as well (``ask_merges``, key ``merges``)."""
    from crl_harness.eval.heldout import load_actor

    # the actor in its own dtype (``dtype`` is the extractor's)
    played, fingerprint = actor_episodes(cfg, actor_count, cfg.actor.dtype) if actor_count \
        else ([], None)

    # on the engine training distils with (extractor.rollout_engine): vLLM answered the 96
    # prompts of 48 episodes in half of transformers' time (benchmarks/RESULTS.md)
    backend = load_actor(cfg, extractor, dtype, role="extractor")
    try:
        results = _ask(cfg, backend, extractor, dtype, count, samples, replay_levels, played)
        if merge_count:
            results["merges"] = ask_merges(cfg, backend, merge_count, samples, replay_levels)
    finally:
        backend.close()
    if fingerprint is not None:
        results["actor_episodes"] = {"episodes": len(played), "won": sum(
            e.trajectory.won for e in played), "fingerprint": fingerprint}
        print(f"  the actor's episodes: {len(played)}, {results['actor_episodes']['won']} won; "
              f"transcripts' fingerprint {fingerprint}")
    return results


def _ask(cfg, backend, extractor: str, dtype: str, count: int, samples: int,
         replay_levels: int, played: list) -> dict:

    oracle_played = heldout_episodes(cfg, backend, count)
    episodes = oracle_played + played
    cases = [case_of(e) for e in oracle_played] + [f"actor: {case_of(e)}" for e in played]
    asked = [taught(e, cfg) for e in episodes]
    prompts = [[{"role": "user", "content": prompt}] for prompt, _ in asked]
    print(f"extractor quality: {extractor} ({dtype}) on {cfg.tasks.envs[0].id}, {count} "
          f"episodes of the taught cases from held-out level {cfg.tasks.heldout_offset}",
          flush=True)
    results: dict[str, dict] = {}
    # the greedy add cases, the oracle's and the actor's: key, lesson added
    added: dict[str, list[tuple[str, str | None]]] = {"add": [], "actor: add": []}
    for label, temperature, repeats in (("greedy", 0.0, 1),
                                        (f"T={cfg.extractor.temperature}",
                                         cfg.extractor.temperature, samples)):
        started = time.perf_counter()
        counts = {case: {"right": 0, "other": 0, "malformed": 0} for case in CASES + ACTOR_CASES}
        examples = []
        for _ in range(repeats):
            answers = backend.generate(prompts, max_new_tokens=cfg.extractor.max_new_tokens,
                                       temperature=temperature, top_p=cfg.extractor.top_p)
            for episode, case, answer, (_, ops) in zip(episodes, cases, answers, asked,
                                                       strict=True):
                shown = int(episode.advice is not None)
                kind = verdict(answer.text, shown, ops)
                if temperature == 0.0 and case in added:
                    added[case].append((episode.trajectory.retrieval_key,
                                        added_lesson(answer.text, shown)))
                counts[case][kind] += 1
                if kind != "right" and len(examples) < 3:
                    examples.append(f"{case}: {answer.text[:150]!r}")
        results[label] = {"counts": counts, "seconds": time.perf_counter() - started}
        print_counts(label, counts, examples)
    for case, name in (("add", "replay"), ("actor: add", "actor replay")):
        if not replay_levels or not added[case]:
            continue
        results[name] = replayed = replay_lessons(cfg, added[case], replay_levels)
        print_replay(case, replayed, replay_levels)
    return results


def print_counts(label: str, counts: dict[str, dict[str, int]], examples: list[str]) -> None:
    """Each case's right, other and malformed answers (right with its 95% Wilson interval),
    then a few answers that were not right."""
    from crl_harness.eval import wilson_interval

    for case, row in counts.items():
        n = sum(row.values())
        if not n:
            continue
        low, high = wilson_interval(row["right"], n)
        print(f"  {label:8s} {case:15s}: right {row['right']:3d}/{n} = "
              f"{100 * row['right'] / n:5.1f}% [{100 * low:.1f}, {100 * high:.1f}], other "
              f"{row['other']}, malformed {row['malformed']}", flush=True)
    for text in examples:
        print(f"    e.g. {text}")


def print_replay(case: str, replayed: dict, replay_levels: int) -> None:
    """One line of ``replay_lessons``' outcome for the greedy answers of ``case``."""
    n = replayed["levels"]
    mine, oracle = replayed["extractor_wins"], replayed["oracle_wins"]
    print(f"  {case}: replayed on up to {replay_levels} unseen levels of each case's key "
          f"({replayed['keyed']} of {replayed['cases']} cases with an oracle lesson and such "
          f"levels, {n} levels): the extractor's lessons win {mine}/{n} = "
          f"{100 * mine / max(n, 1):.1f}%, the oracle's {oracle}/{n} = "
          f"{100 * oracle / max(n, 1):.1f}%, ratio "
          + (f"{mine / oracle:.2f}" if oracle else "n/a")
          + f"; {replayed['unread']} answers wrote no lesson a policy reads (they lose)",
          flush=True)


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--extractor", default=None, help="default: the extractor the config starts from")
    parser.add_argument("--episodes", type=int, default=48,
                        help="episodes, shared over the taught answers (4..300)")
    parser.add_argument("--samples", type=int, default=2,
                        help="answers per episode at the training temperature (0..8)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "auto"),
                        help="the extractor's weights (default: the config's extractor.dtype, "
                             "what training samples with)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="key=value",
                        help="config overrides, e.g. extractor.rollout_engine=vllm")
    parser.add_argument("--replay-levels", type=int, default=0,
                        help="replay each greedy add answer's lesson on this many unseen levels "
                             "of its key, beside the oracle's lesson (0..64; 0: off)")
    parser.add_argument("--actor-episodes", type=int, default=0, metavar="N",
                        help="also a frozen set of N transcripts the config's starting actor "
                             f"plays (0..{MAX_ACTOR_EPISODES}; 0: off)")
    parser.add_argument("--merge-cases", type=int, default=0, metavar="N",
                        help="also N merge-pass chunks of lessons (a quarter of them distinct "
                             f"keys; 0..{MAX_MERGE_CASES}; 0: off; needs "
                             "warmstart.extractor_lesson=key)")
    parser.add_argument("--out", default="runs/extractor-quality")
    args = parser.parse_args()
    for name, low, high in (("episodes", 4, 300), ("samples", 0, 8), ("replay_levels", 0, 64),
                            ("actor_episodes", 0, MAX_ACTOR_EPISODES),
                            ("merge_cases", 0, MAX_MERGE_CASES)):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name.replace('_', '-')} must be in {low}..{high}")

    from crl_harness.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as err:
        parser.error(str(err))
    if args.merge_cases and cfg.warmstart.extractor_lesson != "key":
        parser.error("--merge-cases folds a key's lessons into the env's lesson of the key; "
                     "add --set warmstart.extractor_lesson=key")
    extractor = args.extractor or cfg.starting_model("extractor")
    results = measure(cfg, extractor, args.dtype or cfg.extractor.dtype, args.episodes,
                      args.samples, args.replay_levels, args.actor_episodes, args.merge_cases)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "extractor_quality.json").write_text(json.dumps(
        {"extractor": extractor, "config": args.config, "overrides": args.set,
         "episodes": args.episodes, "replay_levels": args.replay_levels,
         "actor_episodes": args.actor_episodes, "merge_cases": args.merge_cases,
         "results": results},
        indent=2))
    print(f"wrote {out / 'extractor_quality.json'}")


if __name__ == "__main__":
    main()
