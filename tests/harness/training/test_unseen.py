"""Test-time experience (M-c): attempt 1 fills a fresh bank from the actor's own episodes on
unseen levels, attempt 2 plays each level greedy with that bank and without it."""

from __future__ import annotations

import pytest

from crl_harness.config import load_config
from crl_harness.models.tiny import build_tiny_model
from crl_harness.training import unseen  # the module: pytest would collect test_* names


def test_attempt_two_plays_every_unseen_level_with_and_without_the_first_attempts_bank(tmp_path):
    tiny = build_tiny_model(tmp_path / "tiny")
    cfg = load_config(None, [f"actor.model=hf:{tiny}", f"extractor.model=hf:{tiny}",
                             "tasks.envs=[{id: CRL/Sokoban-v0, kwargs: {max_episode_steps: 2}}]",
                             "actor.max_new_tokens=8", "extractor.max_new_tokens=16",
                             "run.torch_threads=1"])
    seeds = unseen.unseen_levels(3)
    outcomes = unseen.test_time_experience(cfg, actor=f"hf:{tiny}", extractor=f"hf:{tiny}",
                                    seeds=seeds, out=tmp_path / "tt", attempts=2)
    assert set(outcomes) == {"guided", "free"}
    assert sorted(outcomes["guided"]) == sorted(outcomes["free"]) == seeds
    assert (tmp_path / "tt" / "attempt-1" / "bank.sqlite").exists()
    attempt_one = (tmp_path / "tt" / "attempt-1" / "metrics.jsonl").read_text().splitlines()
    assert len(attempt_one) == 1  # one step: the first attempt, actor frozen
    assert '"actor/warmup": 1.0' in attempt_one[0]


def test_hardening_test_time_needs_two_attempts(tmp_path):
    with pytest.raises(ValueError, match="attempts >= 2"):
        unseen.test_time_experience(load_config(None), actor="hf:x", extractor="hf:x", seeds=[1],
                             out=tmp_path, attempts=1)
