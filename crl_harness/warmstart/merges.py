"""Merge-pass samples for the extractor's warm start (``warmstart.extractor_merges``).

The Experience Manager's merge pass shows the extractor a chunk of one env's lessons ordered by
title (``ExperienceManager.merge_pass``). With transferable lessons a title is a retrieval key,
and a bank gathers several lessons of one key as episodes of its levels are distilled: the key's
lesson and miscopies of it (another key's moves under this key's title). A merge pass that is
taught folds them into the key's lesson (``crl_envs.transferable_lesson``) and leaves the other
keys' lessons alone; a chunk whose titles all differ is left as it is (``return``).

Holds ``MergeCase`` (a chunk and the answer taught for it), ``merge_cases`` (cases drawn over
the keys of a range of levels), ``merge_prompt`` (the manager's merge prompt for a case),
``taught_merge`` and ``merge_sample`` (the prompt and answer as a training sample).
"""

from __future__ import annotations

import json
import random
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from crl_harness.experience.distill import numbered_entries
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.experience.prompts import load_prompt
from crl_harness.models.base import encode_chat
from crl_harness.rollout import Turn
from crl_harness.warmstart.data import reply_ids
from crl_harness.warmstart.lessons import KeyLessons

__all__ = ["MERGE_RETURN_SHARE", "MergeCase", "merge_cases", "merge_prompt", "taught_merge",
           "merge_sample"]

MERGE_RETURN_SHARE = 1 / 4
"""of the merge cases, chunks whose titles all differ (answer ``return``): without them a
merge pass taught only to fold would fold lessons of different keys"""
KEYS_SCANNED = 400
"""levels read for their keys' lessons (a dark Room has 25 start cells: all of them)"""


@dataclass(frozen=True)
class MergeCase:
    """A chunk of lessons as a merge pass shows them (ordered by title) and, where a key's
    lessons repeat, their indices and the key's lesson they fold into (None: ``return``)."""

    env_id: str
    shown: tuple[ExperienceEntry, ...]
    targets: tuple[int, ...] = ()
    lesson: ExperienceEntry | None = None
    key: str = ""
    """the retrieval key of ``lesson`` (its levels are where a merged lesson can be replayed)"""


def merge_cases(env_id: str, seeds: range, count: int, *, rng: random.Random, chunk: int,
                env_kwargs: dict[str, Any] | None = None,
                options: dict[str, Any] | None = None) -> list[MergeCase]:
    """``count`` cases over the keys of up to ``KEYS_SCANNED`` levels of ``seeds`` whose env
    writes a transferable lesson. A folding case shows 2-3 lessons under one key's title (at
    most one of them the key's own lesson, the others texts of other keys' lessons that differ
    from it: a bank folds exact repeats on its own) beside up to ``chunk`` - 2 other keys' own
    lessons; ``MERGE_RETURN_SHARE`` of the cases show 2..``chunk`` lessons of distinct keys.
    Raises ValueError where fewer than ``chunk`` + 1 keys have a lesson (the chunks could not
    be drawn)."""
    if chunk < 2:
        raise ValueError(f"a merge chunk holds at least 2 lessons, got {chunk}")
    found: dict[str, tuple[str, ExperienceEntry]] = {}  # a lesson's title: its key, the lesson
    with closing(KeyLessons(env_id, env_kwargs, options)) as lessons:
        for seed in seeds[:KEYS_SCANNED]:
            key, lesson = lessons.keyed(seed)
            if lesson is not None:
                found.setdefault(lesson.title, (key, lesson))
    titles = sorted(found)
    if len(titles) <= chunk:
        raise ValueError(f"{env_id}: {len(titles)} retrieval keys with a transferable lesson in "
                         f"{min(len(seeds), KEYS_SCANNED)} levels; merge samples need more than "
                         f"{chunk}")
    cases = []
    for index in range(count):
        if index < round(count * MERGE_RETURN_SHARE):
            shown = sorted((found[t][1] for t in rng.sample(titles, rng.randint(2, chunk))),
                           key=lambda e: e.title)
            cases.append(MergeCase(env_id, tuple(shown)))
            continue
        title = rng.choice(titles)
        key, lesson = found[title]
        repeats = rng.randint(2, min(3, chunk))
        # miscopies: other keys' texts under this key's title (keys may share a lesson's text)
        unlike = [t for t in titles if found[t][1].content != lesson.content]
        if len(unlike) < repeats:
            raise ValueError(f"{env_id}: too few keys whose lesson differs from {key!r}'s")
        copies = [ExperienceEntry(f"copy-{i}", env_id, title, found[other][1].content)
                  for i, other in enumerate(rng.sample(unlike, repeats))]
        if rng.random() < 1 / 2:
            copies[rng.randrange(repeats)] = lesson
        rng.shuffle(copies)  # written in any order; a sort by title keeps it within the key
        others = [t for t in titles if t != title]
        besides = [found[t][1] for t in rng.sample(others, rng.randint(0, chunk - repeats))]
        shown = tuple(sorted(copies + besides, key=lambda e: e.title))
        targets = tuple(i for i, e in enumerate(shown) if e.title == title)
        cases.append(MergeCase(env_id, shown, targets, lesson, key))
    rng.shuffle(cases)
    return cases


def merge_prompt(case: MergeCase) -> str:
    """The merge prompt the Experience Manager sends for the case's chunk."""
    return load_prompt("experience_merge").substitute(env_id=case.env_id,
                                                       entries=numbered_entries(case.shown))


def taught_merge(case: MergeCase) -> str:
    """The answer taught: one ``merge`` of the key's lessons into the key's lesson, or
    ``return``."""
    ops: list[dict[str, Any]] = [{"op": "return"}] if case.lesson is None else [
        {"op": "merge", "target_idx": list(case.targets), "title": case.lesson.title,
         "content": case.lesson.content}]
    return f"<answer>{json.dumps(ops)}</answer>"


def merge_sample(case: MergeCase, *, tokenizer: Any) -> Turn:
    """The ``merge_prompt`` (chat-encoded as the extractor receives it) and ``taught_merge``."""
    text = taught_merge(case)
    ids = reply_ids(tokenizer, text)
    prompt = [{"role": "user", "content": merge_prompt(case)}]
    return Turn(prompt_token_ids=encode_chat(tokenizer, prompt), token_ids=ids,
                logprobs=[0.0] * len(ids), text=text)
