"""Merge-pass samples of the extractor's warm start: chunks as the manager shows them, a key's
lessons folded into the env's lesson of the key, chunks of distinct keys left alone."""

from __future__ import annotations

import random

import pytest

import crl_envs
from crl_harness.experience import ExperienceBank, ExperienceManager, ManagerConfig
from crl_harness.experience.operations import Merge, parse_merge
from crl_harness.warmstart.merges import (
    MERGE_RETURN_SHARE,
    merge_cases,
    merge_prompt,
    taught_merge,
)

ROOM = "CRL/MiniHackRoom-v0"
DARK = {"variant": "dark", "max_episode_steps": 6}
SEEDS = range(10_000_000, 10_000_400)


@pytest.fixture(scope="module")
def cases():
    return merge_cases(ROOM, SEEDS, 24, rng=random.Random(0), chunk=5, env_kwargs=DARK)


def test_merge_cases_fold_a_keys_lessons_into_its_lesson(cases):
    folding = [c for c in cases if c.lesson is not None]
    assert len(cases) - len(folding) == round(24 * MERGE_RETURN_SHARE)
    for case in cases:
        titles = [e.title for e in case.shown]
        assert titles == sorted(titles) and 2 <= len(titles) <= 5  # as merge_pass shows them
        parsed = parse_merge(taught_merge(case), len(case.shown))
        assert parsed.ok, parsed.error
        if case.lesson is None:
            assert len(set(titles)) == len(titles) and parsed.ops == ()
            continue
        # the env's own lesson of the case's key, not one of the texts shown
        assert (case.lesson.title, case.lesson.content) == \
            crl_envs.transferable_lesson(ROOM, case.key, 6)
        [merge] = parsed.ops
        assert isinstance(merge, Merge) and merge.content == case.lesson.content
        assert merge.targets == tuple(i for i, t in enumerate(titles) if t == case.lesson.title)
        assert len(merge.targets) in (2, 3)
        others = [t for t in titles if t != case.lesson.title]
        assert len(set(others)) == len(others)  # the other keys once each: left alone
        # a bank folds exact repeats itself: at most one shown text is the key's lesson
        assert sum(e.content == case.lesson.content for e in case.shown
                   if e.title == case.lesson.title) <= 1
    # every folding case shows a wrong text of the key
    assert sum(any(e.title == c.lesson.title and e.content != c.lesson.content for e in c.shown)
               for c in folding) == len(folding)


def test_merge_case_prompt_is_the_managers_and_its_answer_folds_the_bank(cases, tmp_path):
    case = next(c for c in cases if c.lesson is not None and len(c.shown) == 5)
    prompts = []

    def merger(prompt):
        prompts.append(prompt)
        return taught_merge(case)

    with ExperienceBank(tmp_path / "bank.sqlite") as bank:
        # written out of order (the key's lessons last, in the case's order among them): the
        # manager's chunk is ordered by title as the case is
        mine = [e for e in case.shown if e.title == case.lesson.title]
        for entry in [e for e in reversed(case.shown) if e not in mine] + mine:
            bank.add(ROOM, entry.title, entry.content, generation_id=entry.id)
        with ExperienceManager(bank, merger, ManagerConfig(merge_chunk=5)) as manager:
            assert manager.merge_pass(ROOM) == 1
            manager.flush()
        assert prompts == [merge_prompt(case)]
        left = sorted((e.title, e.content) for e in bank.entries(ROOM))
    kept = sorted((e.title, e.content) for e in case.shown if e.title != case.lesson.title)
    assert left == sorted(kept + [(case.lesson.title, case.lesson.content)])


def test_hardening_merge_cases_bad_values():
    with pytest.raises(ValueError, match="at least 2"):
        merge_cases(ROOM, SEEDS, 1, rng=random.Random(0), chunk=1, env_kwargs=DARK)
    # two levels give at most two keys: too few for chunks of 5
    with pytest.raises(ValueError, match="merge samples need more than 5"):
        merge_cases(ROOM, range(0, 2), 1, rng=random.Random(0), chunk=5, env_kwargs=DARK)
