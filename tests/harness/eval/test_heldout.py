"""Held-out levels (``crl_harness.eval.heldout``): the outcomes of a model that does not change
are cached, and replayed only when its weights, the env or the dtype change.

The tiny random Llama of ``crl_harness.models.tiny`` on Sokoban: it wins nothing, but plays and
caches as any actor does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from crl_harness.config import load_config
from crl_harness.models.tiny import build_tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def _overrides(model: Path, run_dir: Path) -> list[str]:
    return [f"actor.model=hf:{model}", f"extractor.model=hf:{model}",
            "tasks.envs.0.id=CRL/Sokoban-v0", "tasks.envs.0.kwargs={max_episode_steps: 2}",
            "actor.max_new_tokens=8", f"run.output_dir={run_dir}", "run.tensorboard=false",
            "run.torch_threads=1"]


def test_warm_start_cache_is_free_the_second_time_and_invalidated_by_the_adapter(
        model, tmp_path, monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from crl_harness import eval as eval_module
    from crl_harness.eval.heldout import evaluate_levels

    actor = tmp_path / "actor"
    shutil.copytree(model, actor)
    plays = []
    evaluate = eval_module.evaluate
    monkeypatch.setattr(eval_module, "evaluate",
                        lambda agent, specs, **k: plays.append(len(specs))
                        or evaluate(agent, specs, **k))
    cfg = load_config(None, _overrides(model, tmp_path / "run"))
    cases = {"held-out": ([50_000_000, 50_000_001], False)}

    def before(config=cfg, dtype="auto"):
        return evaluate_levels(config, f"hf:{actor}", cases, tmp_path / "out",
                               cache=tmp_path / "cache", dtype=dtype)

    first = before()
    assert plays == [2] and set(first["held-out"]) == {50_000_000, 50_000_001}
    assert before() == first and plays == [2]  # cached: nothing played
    weights = load_file(actor / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name] + 0.01
    save_file(weights, actor / "model.safetensors", metadata={"format": "pt"})
    before()
    assert plays == [2, 2]  # the changed weights are played again
    other_env = load_config(None, [*_overrides(model, tmp_path / "run"),
                                   "tasks.envs.0.kwargs={max_episode_steps: 3}"])
    before(other_env)
    assert plays == [2, 2, 2]  # as are other env kwargs
    before(dtype="bfloat16")
    assert plays == [2, 2, 2, 2]  # and another dtype of the weights (crl demo's bf16)


def test_a_level_the_bank_has_no_lesson_for_is_played_once_and_counts_for_both_cases(
        model, tmp_path, monkeypatch):
    import gymnasium as gym

    from crl_harness import eval as eval_module
    from crl_harness.eval.heldout import evaluate_levels
    from crl_harness.experience import ExperienceBank

    covered, bare = 50_000_000, 50_000_001
    env = gym.make("CRL/Sokoban-v0", max_episode_steps=2)
    key = env.reset(seed=covered)[1]["retrieval_query"]
    env.close()
    bank = ExperienceBank(tmp_path / "bank.sqlite")
    bank.add("CRL/Sokoban-v0", key, "Push the lower box east first.")
    bank.close()
    plays = []
    evaluate = eval_module.evaluate
    monkeypatch.setattr(eval_module, "evaluate",
                        lambda agent, specs, **k: plays.append(
                            sorted((s.seed, s.use_experience) for s in specs))
                        or plays.append(evaluate(agent, specs, **k)) or plays[-1])
    cfg = load_config(None, _overrides(model, tmp_path / "run"))
    both = evaluate_levels(cfg, f"hf:{model}", {"free": ([covered, bare], False),
                                                 "guided": ([covered, bare], True)},
                           tmp_path / "out", bank=tmp_path / "bank.sqlite")
    # the level with a lesson is played guided; the one without, once, for both cases
    assert plays[0] == [(covered, False), (covered, True), (bare, False)]
    assert both["guided"][bare] == both["free"][bare] and set(both["guided"]) == {covered, bare}
    report = json.loads((tmp_path / "out" / "guided" / "report.json").read_text())
    assert report["meta"]["twin_seeds"] == [bare] and report["envs"][0]["episodes"] == 2
    assert report["meta"]["handed_lessons"] == {}  # a lesson in words: nothing to replay
    guided_played = {t.seed: t for t in plays[1]}
    assert guided_played[covered].experience_ids  # the lesson was shown
    # why the twin stands: alone, the lesson-free level's guided episode sees the free prompt
    evaluate_levels(cfg, f"hf:{model}", {"guided": ([bare], True)}, tmp_path / "alone",
                    bank=tmp_path / "bank.sqlite")
    alone = plays[3][0]
    assert alone.use_experience and not alone.experience_ids
    assert alone.system == guided_played[bare].system
    assert [t.prompt_token_ids + t.token_ids for t in alone.turns] == \
        [t.prompt_token_ids + t.token_ids for t in guided_played[bare].turns]


def test_a_case_with_the_bank_records_which_levels_were_handed_a_lesson_that_wins_replayed(
        model, tmp_path):
    pytest.importorskip("nle", reason="the minihack extra: pip install 'crl-gym[minihack]'")
    import gymnasium as gym

    import crl_envs  # noqa: F401  (registers the ids)
    from crl_harness.eval.heldout import evaluate_levels, handed_lessons, handed_line
    from crl_harness.experience import ExperienceBank

    room = "CRL/MiniHackRoom-v0"
    near, far, bare = 20_000_004, 20_000_000, 20_000_001  # near: the stairs 1 south
    env = gym.make(room, variant="dark", max_episode_steps=2)
    keys = {seed: env.reset(seed=seed)[1]["retrieval_query"] for seed in (near, far, bare)}
    env.close()
    assert len(set(keys.values())) == 3
    bank = ExperienceBank(tmp_path / "bank.sqlite")
    bank.add(room, f"Winning moves from {keys[near]}", "from the start, play south.")
    bank.add(room, f"Winning moves from {keys[far]}", "from the start, play north.")
    bank.close()
    cfg = load_config(None, [*_overrides(model, tmp_path / "run"), f"tasks.envs.0.id={room}",
                             "tasks.envs.0.kwargs={variant: dark, max_episode_steps: 2}"])
    out = evaluate_levels(cfg, f"hf:{model}", {"free": ([near, far, bare], False),
                                                "guided": ([near, far, bare], True)},
                          tmp_path / "out", bank=tmp_path / "bank.sqlite")
    handed = handed_lessons(tmp_path / "out" / "guided" / "report.json")
    # each level with a lesson of its key gets it; south wins near, north loses far; bare: none
    assert handed == {near: True, far: False}
    assert handed_lessons(tmp_path / "out" / "free" / "report.json") == {}
    assert handed_line(handed, out["free"], out["guided"]).startswith(
        "handed a lesson a replay reads on 2 of 3 levels, 1 of them winning replayed")
