"""Test-time experience (M-c): attempt 1 fills a fresh bank from the actor's own episodes on
unseen levels, attempt 2 plays each level greedy with that bank and without it."""

from __future__ import annotations

from collections import Counter

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
    assert (tmp_path / "tt" / "round-1" / "attempt-1" / "bank.sqlite").exists()
    attempt_one = (tmp_path / "tt" / "round-1" / "attempt-1" / "metrics.jsonl").read_text()\
        .splitlines()
    assert len(attempt_one) == 1  # one step: the first attempt, actor frozen
    assert '"actor/warmup": 1.0' in attempt_one[0]


DARK_ROOM = ["tasks.envs=[{id: CRL/MiniHackRoom-v0, kwargs: {variant: dark}}]"]


def test_levels_that_share_a_retrieval_key_play_in_rounds_with_banks_of_their_own(tmp_path,
                                                                               monkeypatch):
    # one bank with two levels of a key hands one of them the other's route
    cfg = load_config(None, DARK_ROOM)
    seeds = unseen.unseen_levels(24)
    keys = unseen.retrieval_keys(cfg, seeds)
    assert len(set(keys.values())) < len(seeds)  # dark starts share their start cell's key
    played = []

    def one_round(cfg, actor, extractor, seeds, out, attempts, dtype):
        played.append((list(seeds), out))
        return {"guided": dict.fromkeys(seeds, True), "free": dict.fromkeys(seeds, False)}

    monkeypatch.setattr(unseen, "_one_round", one_round)
    outcomes = unseen.test_time_experience(cfg, actor="hf:a", extractor="hf:e", seeds=seeds,
                                           out=tmp_path)
    assert len(played) > 1
    assert sorted(s for round_seeds, _ in played for s in round_seeds) == seeds
    for round_seeds, _ in played:
        assert len({keys[s] for s in round_seeds}) == len(round_seeds)
    assert len({out for _, out in played}) == len(played)  # a bank each
    assert sorted(outcomes["guided"]) == seeds


def test_unseen_levels_keep_at_most_per_key_levels_of_a_key():
    cfg = load_config(None, DARK_ROOM)
    seeds = unseen.unseen_levels(32, cfg=cfg, per_key=2)
    assert len(seeds) == len(set(seeds)) == 32 and min(seeds) >= unseen.UNSEEN_OFFSET
    counts = Counter(unseen.retrieval_keys(cfg, seeds).values())
    assert max(counts.values()) == 2
    assert len(unseen.key_rounds(unseen.retrieval_keys(cfg, seeds))) == 2


def test_hardening_unseen_levels_per_key_needs_a_config_and_a_positive_count():
    with pytest.raises(ValueError, match="per_key needs a config"):
        unseen.unseen_levels(4, per_key=2)
    with pytest.raises(ValueError, match="per_key >= 1"):
        unseen.unseen_levels(4, cfg=load_config(None, DARK_ROOM), per_key=0)


def test_hardening_unseen_levels_stop_scanning_where_keys_run_out(monkeypatch):
    # an env whose every level has one key: per_key 1 finds one level, never a second
    monkeypatch.setattr(unseen, "retrieval_keys",
                        lambda cfg, seeds: dict.fromkeys(seeds, "the one key"))
    with pytest.raises(ValueError, match="only 1 levels with at most 1 a retrieval key"):
        unseen.unseen_levels(2, cfg=object(), per_key=1)


def test_hardening_test_time_needs_two_attempts(tmp_path):
    with pytest.raises(ValueError, match="attempts >= 2"):
        unseen.test_time_experience(load_config(None), actor="hf:x", extractor="hf:x", seeds=[1],
                             out=tmp_path, attempts=1)
