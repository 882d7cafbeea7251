"""The trainer on real envs with small real models: the three arms, weight changes, the bank,
metrics and plot, kill -9 then --resume, and the Ray backend.

The models are the tiny random Llama of ``crl_harness.models.tiny``. The actor is first taught
(supervised steps, cached per machine) to answer ``<think>..</think><answer>MOVE</answer>`` most
of the time; its sampled replies still break the format now and then, so rewards vary inside a
group and GRPO has something to learn from. The extractor stays random: its answers fail to
parse (counted as format failures, not trained by default), so the bank is seeded before the run
and the CISPO update is checked on generations with mixed rewards.

bf16 runs here are on CPU (no GPU in the test environment): same code path, CPU kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from crl_envs.data import cache_dir
from crl_harness.config import load_config
from crl_harness.experience import GenerationReward
from crl_harness.models.base import encode_chat
from crl_harness.models.tiny import build_tiny_model
from crl_harness.training.batches import actor_rows
from crl_harness.training.losses import grpo_loss
from crl_harness.training.metrics import read_metrics
from crl_harness.training.run_directory import RunDirectory
from crl_harness.training.trainer import ResumeError, Trainer

torch.set_num_threads(1)
TUNING_VERSION = 3  # bump when _format_tuned changes

ACTOR_TARGETS = [f"<think>go</think><answer>{m}</answer>" for m in ("up", "down", "left", "right")]


def _real_prompts() -> list[list[dict]]:
    """Prompts as the trainer builds them: the actor's on Sokoban, the extractor's distillation."""
    import gymnasium as gym

    from crl_harness.experience.prompts import load_prompt
    from crl_harness.prompting import system_prompt

    env = gym.make("CRL/Sokoban-v0")
    prompts = []
    for seed in range(4):
        observation, info = env.reset(seed=seed)
        prompts.append([{"role": "system", "content": system_prompt(info["instructions"])},
                        {"role": "user", "content": observation}])
        prompts.append([{"role": "user", "content": load_prompt("experience_distill").substitute(
            env_id="CRL/Sokoban-v0", task=info["task"], outcome="FAILURE", score="0",
            retrieved="(none)", max_ops=3, transcript=observation * 2)}])
    env.close()
    return prompts


def _format_tuned(directory: Path, targets: list[str], steps: int = 80, lr: float = 3e-3) -> Path:
    """The tiny model after a few supervised steps on ``targets`` after real prompts.

    Built once per machine under the user cache (a minute on a busy 2-core machine)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    key = hashlib.sha256(json.dumps([targets, steps, lr, TUNING_VERSION]).encode()).hexdigest()[:12]
    tuned = cache_dir() / "test-models" / f"{directory.name}-{key}"
    if (tuned / "config.json").exists():
        return tuned
    build_tiny_model(directory, hidden_size=64)  # small enough to learn the format in seconds
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(0)
    prompts = _real_prompts()
    for _ in range(steps):
        prompt = prompts[int(torch.randint(len(prompts), (1,), generator=generator))]
        target = targets[int(torch.randint(len(targets), (1,), generator=generator))]
        prefix = encode_chat(tokenizer, prompt)
        answer = tokenizer(target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prefix + answer])
        labels = ids.clone()
        labels[0, : len(prefix)] = -100
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    staging = directory.with_name(directory.name + "-tuned")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    tuned.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(staging, tuned.with_name(tuned.name + ".tmp"), dirs_exist_ok=True)
    os.replace(tuned.with_name(tuned.name + ".tmp"), tuned)
    return tuned


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return _format_tuned(root / "actor", ACTOR_TARGETS, steps=200), build_tiny_model(root / "x")


def _seed_bank(folder: Path) -> tuple[list[str], str]:
    """A bank export for the run to start from (``experience.initial_bank``, as a bank carried
    over from an earlier run), so guided rollouts retrieve from the first step: the entries'
    ids and the override."""
    from crl_harness.experience import ExperienceBank

    with ExperienceBank(folder / "seed" / "bank.sqlite") as bank:
        ids = [bank.add("CRL/Sokoban-v0", title, content, generation_id=f"seed-{i}").id
               for i, (title, content) in enumerate([
                   ("Corners", "Never push a box into a corner that is not a target."),
                   ("Walls", "A box pushed against a wall can only move along it."),
                   ("Plan", "Count the moves to each target before the first push.")])]
        bank.export_jsonl(folder / "seed" / "bank.jsonl")
    return ids, f"experience.initial_bank={folder / 'seed' / 'bank.jsonl'}"


def _overrides(models, run_dir: Path, arm: str = "co-evolve", steps: int = 2) -> list[str]:
    actor, extractor = models
    return [
        f"arm={arm}", f"name=test-{arm}", f"actor.model=hf:{actor}",
        f"extractor.model=hf:{extractor}",
        "tasks.envs.0.id=CRL/Sokoban-v0", "tasks.envs.0.kwargs={max_episode_steps: 3}",
        "tasks.groups_per_step=2", "tasks.group_size=4", "tasks.guided_per_group=2",
        "actor.warmup_steps=0", "actor.max_new_tokens=32", "actor.temperature=0.7",
        "actor.lr=1e-3", "extractor.lr=1e-3", "extractor.max_new_tokens=64",
        "extractor.temperature=0.5", "extractor.train_after=1", "experience.merge_every=2",
        f"run.steps={steps}", "run.checkpoint_every=1", f"run.output_dir={run_dir}",
        "run.tensorboard=false", "run.torch_threads=1",
        "experience.min_query_coverage=0",  # the seeded lessons are in words, of no level's key
    ]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def test_co_evolve_trains_both_models_fills_the_bank_and_writes_metrics(models, tmp_path):
    seeded, initial_bank = _seed_bank(tmp_path)
    cfg = load_config(None, [*_overrides(models, tmp_path), initial_bank,
                             "extractor.kv_cache_tokens=2048"])
    trainer = Trainer(cfg)
    # each model its own KV cache: the extractor's setting reaches the extractor's backend only
    assert trainer.experience.backend.kv_cache_tokens == 2048
    assert trainer.actor_backend.kv_cache_tokens == cfg.actor.kv_cache_tokens != 2048
    # and its own sampling: actor.* reaches the rollouts, extractor.* the extractor's generator
    rollout, generator = trainer.rollouts.config, trainer.experience.generator
    assert (rollout.actor.temperature, rollout.actor.max_new_tokens) == (0.7, 32)
    assert (generator.temperature, generator.max_new_tokens) == (0.5, 64)
    trainer.train()

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    last = records[-1]
    for key in ("success/all", "success/guided", "success/free", "success/Sokoban", "reward/all",
                "loss/actor", "clip/actor", "bank/size", "extractor/format_failures",
                "extractor/merges", "bank/merge_chunks",
                "time/rollout", "time/actor_update", "time/extractor_update"):
        assert key in last, key
    assert last["bank/size"] == len(seeded)  # the random extractor's answers never parse
    assert last["extractor/distillations"] >= 4 and last["extractor/format_failures"] >= 4
    assert not any("loss/extractor" in r for r in records)  # malformed answers are not trained
    assert all(r["actor/warmup"] == 0.0 and "actor/logprob_gap_mean" in r for r in records)
    assert all(r["experience/retrieved_per_guided"] == 1.0 for r in records)
    assert (tmp_path / "learning_curve.png").stat().st_size > 10_000

    actor_after = _weights(tmp_path / "checkpoints" / "step-000002" / "actor_hf")
    actor_before = _weights(models[0])
    assert any(not torch.equal(actor_before[k], actor_after[k]) for k in actor_before)
    assert (tmp_path / "checkpoints" / "step-000002" / "extractor.pt").exists()


def _completion_logprob_sums(learner, rows) -> torch.Tensor:
    with torch.no_grad():
        logprobs, mask = learner.token_logprobs(rows)
    return (logprobs * mask).sum(dim=1)


def test_grpo_update_raises_the_rewarded_episodes_and_lowers_the_others(models, tmp_path):
    """The update's direction, end to end: real rollouts, their packed rows, one GRPO step. The
    replies of the episodes rewarded above their subgroup's mean gain log-probability, the others
    lose it (a sign, mask or row-to-advantage mix-up fails this)."""
    # A small step, so the first-order effect of the gradient is what is measured: at the other
    # tests' 1e-3 one Adam step (about lr times the sign of each gradient) reshapes the tiny model.
    cfg = load_config(None, [*_overrides(models, tmp_path, arm="none", steps=1), "actor.lr=1e-5"])
    trainer = Trainer(cfg)
    played = trainer.rollouts.run(trainer._episode_specs(trainer.sampler.sample(1),
                                                             retrieve=False))
    rewarded = [dataclasses.replace(t, reward=float(i % 2)) for i, t in enumerate(played)]
    rows, _ = actor_rows(rewarded, normalize_std=cfg.actor.normalize_std)
    assert {r.advantage for r in rows} == {0.5, -0.5}
    before = _completion_logprob_sums(trainer.actor, rows)
    trainer.actor.update(rows, functools.partial(grpo_loss, clip_eps=cfg.actor.clip_eps))
    change = _completion_logprob_sums(trainer.actor, rows) - before
    up = torch.tensor([r.advantage > 0 for r in rows])
    assert change[up].mean() > 0 > change[~up].mean()


def test_cispo_update_changes_the_extractor(models, tmp_path):
    """The extractor's update on real generations with mixed credit moves its weights."""
    cfg = load_config(None, _overrides(models, tmp_path))
    trainer = Trainer(cfg)
    try:
        backend = trainer.experience.backend
        generations = backend.generate([[{"role": "user", "content": "Lessons, please."}]] * 4,
                                       max_new_tokens=24, temperature=1.0, seed=0)
        buffer = [GenerationReward(f"g{i}", "Lessons, please.", g, reward, uses, "distill")
                  for i, (g, reward, uses) in enumerate(zip(generations, [1.0, -1.0, 0.5, -1.0],
                                                            [2, 1, 1, 3], strict=True))]
        before = {k: v.clone() for k, v in trainer.extractor.base_model.state_dict().items()}
        stats = trainer._update_extractor(buffer)
        assert stats.rows == 4 and stats.tokens > 0 and stats.loss != 0.0
        after = trainer.extractor.base_model.state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before)
    finally:
        trainer.close()


def _generations(trainer: Trainer, n: int) -> list:
    return trainer.experience.backend.generate(
        [[{"role": "user", "content": f"Lessons, please ({i})."}] for i in range(n)],
        max_new_tokens=16, temperature=1.0, seed=0)


def _capture_rows(learner) -> list:
    """The rows ``learner.update`` is given, kept as it runs."""
    rows: list = []
    update = learner.update

    def capturing(batch, loss):
        rows.extend(batch)
        return update(batch, loss)

    learner.update = capturing
    return rows


def test_extractor_advantage_is_reward_minus_batch_mean_one_sample_per_generation(models, tmp_path):
    cfg = load_config(None, _overrides(models, tmp_path))
    assert cfg.extractor.repeat_by_uses is False  # the paper's form is the default
    trainer = Trainer(cfg)
    try:
        generations = _generations(trainer, 3)
        rewards, uses = [1.0, -1.0, 0.5], [3, 1, 1]
        buffer = [GenerationReward(f"g{i}", "p", g, r, n, "distill")
                  for i, (g, r, n) in enumerate(zip(generations, rewards, uses, strict=True))]
        rows = _capture_rows(trainer.extractor)
        trainer._update_extractor(buffer)
        mean = sum(rewards) / 3  # not weighted by uses
        by_tokens = {tuple(r.completion_ids): r for r in rows}
        for g, reward in zip(generations, rewards, strict=True):
            row = by_tokens[tuple(g.token_ids)]
            assert row.advantage == pytest.approx(reward - mean)
            assert row.token_weight == pytest.approx(1 / (3 * g.num_tokens))  # one sample each

        trainer.cfg.extractor.repeat_by_uses = True  # the documented option: one sample per use
        rows.clear()
        trainer._update_extractor(buffer)
        weighted = (3 * 1.0 - 1.0 + 0.5) / 5
        by_tokens = {tuple(r.completion_ids): r for r in rows}
        for g, reward, n in zip(generations, rewards, uses, strict=True):
            row = by_tokens.get(tuple(g.token_ids))
            if reward == weighted:
                assert row is None  # A = 0: nothing to train
            else:
                assert row.advantage == pytest.approx(reward - weighted)
                assert row.token_weight == pytest.approx(n / (5 * g.num_tokens))
    finally:
        trainer.close()


def test_generation_used_in_two_steps_is_trained_on_the_mean_of_both_uses(models, tmp_path):
    cfg = load_config(None, _overrides(models, tmp_path) + ["extractor.train_after=2"])
    trainer = Trainer(cfg)
    try:
        ledger = trainer.experience.manager.ledger
        first, second = _generations(trainer, 2)
        ledger.register("first", "p", first, "distill")
        ledger.credit(["first"], score=1.0)  # a rollout of step 1 used what it wrote
        assert trainer._extractor_step() is None  # one waiting, train_after=2: it stays
        assert len(ledger) == 1
        ledger.credit(["first"], score=0.0)  # step 2: used again, the episode failed (-1)
        ledger.register("second", "p", second, "distill")
        ledger.credit(["second"], score=1.0)
        rows = _capture_rows(trainer.extractor)
        stats = trainer._extractor_step()
        assert stats is not None and stats.rows == 2
        # first: mean(1, -1) = 0 (not 1, its reward at the end of step 1); second: 1.
        by_tokens = {tuple(r.completion_ids): r.advantage for r in rows}
        assert by_tokens[tuple(first.token_ids)] == pytest.approx(0.0 - 0.5)
        assert by_tokens[tuple(second.token_ids)] == pytest.approx(1.0 - 0.5)
        assert len(ledger) == 0  # trained: released
    finally:
        trainer.close()


def test_the_last_step_trains_the_extractor_on_every_generation_still_waiting(models, tmp_path):
    """A run's final credit is not dropped: below ``train_after`` a generation waits on any step
    but the last, where the partial batch trains (issue: >= 30 credited samples a run)."""
    cfg = load_config(None, _overrides(models, tmp_path) + ["extractor.train_after=8"])
    trainer = Trainer(cfg)
    try:
        ledger = trainer.experience.manager.ledger
        for name, generation, score in zip(("won", "lost"), _generations(trainer, 2), (1.0, 0.0),
                                           strict=True):
            ledger.register(name, "p", generation, "distill")
            ledger.credit([name], score=score)
        assert trainer._extractor_step() is None and len(ledger) == 2  # 2 < 8: they wait
        stats = trainer._extractor_step(last=True)
        assert stats is not None and stats.rows == 2
        assert len(ledger) == 0 and trainer.counters["extractor/generations_rewarded"] == 2
    finally:
        trainer.close()


def test_malformed_extractor_answers_are_not_trained_by_default(models, tmp_path):
    from crl_harness.experience import DistillationRequest

    request = DistillationRequest("CRL/Sokoban-v0", "push the boxes", "...", False, 0.0, [], 1)
    for penalty, waiting in ((None, []), (-1.0, [-1.0])):
        overrides = _overrides(models, tmp_path / str(penalty))
        if penalty is not None:
            overrides.append(f"extractor.format_penalty={penalty}")
        trainer = Trainer(load_config(None, overrides))
        try:
            trainer.experience.manager.submit(request)  # the random extractor's answer never parses
            trainer.experience.manager.flush()
            assert trainer.experience.manager.stats()["format_failures"] == 1
            assert [g.reward for g in trainer.experience.manager.generation_rewards()] == waiting
            if penalty is None:
                assert trainer._extractor_step() is None
        finally:
            trainer.close()


def test_warmup_retrieves_nothing_and_trains_neither_model(models, tmp_path):
    _, initial_bank = _seed_bank(tmp_path)
    cfg = load_config(None, _overrides(models, tmp_path) + ["actor.warmup_steps=1", initial_bank])
    Trainer(cfg).train()
    warmup, after = read_metrics(tmp_path / "metrics.jsonl")
    assert warmup["actor/warmup"] == 1.0 and after["actor/warmup"] == 0.0
    # null experience.retrieval_warmup_steps: the retrieval warm-up follows the actor's
    assert warmup["experience/warmup"] == 1.0 and after["experience/warmup"] == 0.0
    # Step 1: no rollout retrieved (so no "guided" success), nothing trained or credited.
    assert math.isnan(warmup["experience/retrieved_per_guided"])
    assert math.isnan(warmup["success/guided"]) and warmup["rollout/episodes"] == 8
    assert "loss/actor" not in warmup and "loss/extractor" not in warmup
    assert warmup.get("extractor/generations_rewarded", 0.0) == 0.0
    step1 = _weights(tmp_path / "checkpoints" / "step-000001" / "actor_hf")
    initial = _weights(models[0])
    assert all(torch.equal(initial[k], step1[k]) for k in initial)
    # Step 1 was still distilled, one episode a group (the bank fills during warm-up).
    assert after["extractor/distillations"] >= 2
    assert after["experience/retrieved_per_guided"] == 1.0 and "loss/actor" in after


def test_retrieval_warmup_is_separate_from_the_actor_freeze(models, tmp_path,
                                                           alternating_rewards):
    """``experience.retrieval_warmup_steps=1`` with ``actor.warmup_steps=0``: step 1 retrieves
    nothing and credits nothing, yet the actor trains; step 2 retrieves."""
    _, initial_bank = _seed_bank(tmp_path)
    cfg = load_config(None, _overrides(models, tmp_path) + [
        "actor.warmup_steps=0", "experience.retrieval_warmup_steps=1", initial_bank])
    assert (cfg.actor_warmup, cfg.retrieval_warmup) == (0, 1)
    trainer = Trainer(cfg)
    alternating_rewards(trainer)  # reward variance in every subgroup, so the actor has rows
    trainer.train()
    first, second = read_metrics(tmp_path / "metrics.jsonl")
    assert first["actor/warmup"] == 0.0 and first["experience/warmup"] == 1.0
    assert "loss/actor" in first and first["grad_norm/actor"] > 0
    assert math.isnan(first["experience/retrieved_per_guided"])
    assert first.get("extractor/generations_rewarded", 0.0) == 0.0
    assert second["experience/warmup"] == 0.0
    assert second["experience/retrieved_per_guided"] == 1.0 and "loss/actor" in second


@pytest.mark.parametrize("arm, guided", [("co-evolve", 4), ("static", 4), ("none", 0)])
def test_a_step_of_32_episodes_in_groups_of_8_is_4_guided_and_4_free(arm, guided):
    """Issue 32's shape, from the config alone (no model): 4 groups of 8 a step, the first 4 of
    each group guided; with arm none all 8 free."""
    from crl_harness.training.sampler import TaskSampler

    cfg = load_config("cpu-demo", [f"arm={arm}", "tasks.groups_per_step=4",
                                   "tasks.group_size=8", "tasks.guided_per_group=4"])
    trainer = Trainer.__new__(Trainer)  # only the spec builder: no run folder, no models
    trainer.cfg, trainer.sampler = cfg, TaskSampler(cfg.tasks, cfg.run.seed)
    specs = trainer._episode_specs(trainer.sampler.sample(1))
    assert len(specs) == 32
    for group in range(4):
        members = [s for s in specs if s.group_id == group]
        assert len(members) == 8 and len({(s.env_id, s.seed) for s in members}) == 1
        assert [s.use_experience for s in members] == [True] * guided + [False] * (8 - guided)
        assert [s.guided for s in members] == [s.use_experience for s in members]
    # during the retrieval warm-up every slot plays without experience, in every arm; the guided
    # slots stay guided (they are distilled)
    warmup = trainer._episode_specs(trainer.sampler.sample(2), retrieve=False)
    assert not any(s.use_experience for s in warmup)
    assert sum(s.guided for s in warmup) == 4 * guided


def test_the_episodes_that_teach_are_distilled_wherever_they_stand(models, tmp_path):
    """Step 3 reads each trajectory's group and outcome, not its place in the batch: the
    rollouts here return a step's trajectories in reverse, during the retrieval warm-up (no
    experience shown), and each group's shortest win (or, where it won nothing, its first
    episode) is what is distilled (``episodes_to_distill``)."""
    from crl_harness.experience import episodes_to_distill

    cfg = load_config(None, _overrides(models, tmp_path, arm="static", steps=1)
                      + ["experience.retrieval_warmup_steps=1"])
    trainer = Trainer(cfg)
    run, played, submitted = trainer.rollouts.run, [], []

    def reversed_run(specs):
        played[:] = run(specs)[::-1]
        return played

    trainer.rollouts.run = reversed_run
    trainer.experience.manager.submit = submitted.append
    try:
        trainer.train_step(1)
    finally:
        trainer.close()
    assert sum(t.guided for t in played) == 4 and not any(t.use_experience for t in played)
    chosen = episodes_to_distill([t for t in played if not t.error], 2)
    assert len(chosen) == 2  # one a group
    assert [r.transcript for r in submitted] == [t.transcript for t in chosen]


def test_arm_none_is_never_frozen_by_the_warmup(models, tmp_path, alternating_rewards):
    cfg = load_config(None, _overrides(models, tmp_path, arm="none", steps=1)
                      + ["actor.warmup_steps=3"])
    trainer = Trainer(cfg)
    alternating_rewards(trainer)
    metrics = trainer.train()
    assert metrics["actor/warmup"] == 0.0 and "experience/warmup" not in metrics
    assert "loss/actor" in metrics and metrics["grad_norm/actor"] > 0


def test_bf16_run_on_cpu_updates_every_weight_at_lr_1e_6_with_ratios_one(models, tmp_path):
    cfg = load_config(None, _overrides(models, tmp_path, arm="none", steps=1)
                      + ["actor.dtype=bfloat16", "actor.lr=1e-6"])
    trainer = Trainer(cfg)
    assert trainer.actor.dtype == torch.bfloat16 and trainer.actor.recompute_old_logprobs
    metrics = trainer.train()
    assert metrics["loss/actor"] != 0.0 or metrics["grad_norm/actor"] > 0
    assert metrics["clip/actor"] == 0.0  # on-policy ratios are 1: nothing is clipped
    assert metrics["actor/logprob_gap_max"] >= metrics["actor/logprob_gap_mean"] >= 0.0
    [record] = read_metrics(tmp_path / "metrics.jsonl")
    assert "actor/logprob_gap_mean" in record and "actor/logprob_gap_max" in record
    saved = torch.load(tmp_path / "checkpoints" / "step-000001" / "actor.pt",
                       weights_only=False)["model"]
    initial = _weights(models[0])
    for key, value in initial.items():  # fp32 masters moved off the bf16 start, every tensor
        assert saved[key].dtype == torch.float32
        assert not torch.equal(saved[key], value.to(torch.bfloat16).float()), key


@pytest.mark.parametrize("arm", ["static", "none"])
def test_baseline_arms_from_the_same_config(models, tmp_path, arm):
    cfg = load_config(None, _overrides(models, tmp_path, arm=arm, steps=2))
    trainer = Trainer(cfg)
    assert trainer.extractor is None
    metrics = trainer.train()
    checkpoint = tmp_path / "checkpoints" / "step-000002"
    assert not (checkpoint / "extractor.pt").exists()
    if arm == "none":
        assert trainer.experience is None and not (tmp_path / "bank.sqlite").exists()
        assert "success/guided" not in metrics and metrics["rollout/episodes"] == 8
    else:  # the frozen extractor still distils step 1 (no lesson yet: one episode a group)
        assert metrics["extractor/distillations"] >= 2
        assert "success/guided" in metrics


def test_resume_without_checkpoint_is_one_clear_error(models, tmp_path):
    cfg = load_config(None, _overrides(models, tmp_path))
    with pytest.raises(ResumeError, match="holds no run to resume"):
        Trainer(cfg, resume=True)
    RunDirectory.create(tmp_path).close()  # a run that died before its first checkpoint
    with pytest.raises(ResumeError, match="no checkpoint of run .* start over with --overwrite"):
        Trainer(cfg, resume=True)


@pytest.mark.slow
def test_kill_9_then_resume_continues_from_the_last_checkpoint(models, tmp_path):
    run_dir = tmp_path / "run"
    seeded, initial_bank = _seed_bank(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text("name: tiny\n")
    overrides = [*_overrides(models, run_dir, steps=5), initial_bank]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "crl_harness.cli", "train", str(config), *overrides,
               "--no-progress"]
    log = tmp_path / "train.log"  # a file, not a pipe: a full pipe would stall the child
    with open(log, "wb") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
    checkpoints = run_dir / "checkpoints"
    deadline = time.monotonic() + 240
    while not (checkpoints / "step-000002").exists():
        assert process.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint at step 2 in time"
        time.sleep(0.2)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()

    latest = max(p for p in checkpoints.iterdir() if p.name.startswith("step-"))
    saved = json.loads((latest / "state.json").read_text())
    assert 2 <= saved["step"] < 5
    cfg = load_config(config, overrides)
    trainer = Trainer(cfg, resume=True)
    assert trainer.step == saved["step"]
    assert len(trainer.experience.bank) == saved["bank_entries"] == len(seeded)
    assert sorted(e.id for e in trainer.experience.bank.entries()) == sorted(seeded)
    trainer.train()
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert json.loads((checkpoints / "step-000005" / "state.json").read_text())["step"] == 5


@pytest.mark.slow
def test_ray_backend_same_semantics(models, tmp_path, alternating_rewards):
    pytest.importorskip("ray")
    from crl_harness.commands.train import make_trainer

    _, initial_bank = _seed_bank(tmp_path)
    cfg = load_config(None, _overrides(models, tmp_path, steps=2) + [
        "run.backend=ray", initial_bank, "extractor.kv_cache_tokens=2048"])
    trainer = make_trainer(cfg)
    # the service actor's own extractor copy gets the extractor's settings, KV cache included
    import ray

    service = trainer.experience.handle
    assert ray.get(service.__ray_call__.remote(
        lambda s: (s.backend.kv_cache_tokens, s.generator.temperature))) == (2048, 0.5)
    alternating_rewards(trainer)  # reward variance in every group, whatever the workers sampled
    metrics = trainer.train()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert metrics["rollout/episodes"] == 8 and metrics["bank/size"] == 3
    assert metrics["experience/retrieved_per_guided"] == 1.0
    assert "success/guided" in metrics and "loss/actor" in metrics
    actor_after = _weights(tmp_path / "checkpoints" / "step-000002" / "actor_hf")
    actor_before = _weights(models[0])
    assert any(not torch.equal(actor_before[k], actor_after[k]) for k in actor_before)


def test_lora_trains_only_the_adapters(models, tmp_path, alternating_rewards):
    cfg = load_config(None, _overrides(models, tmp_path, arm="none", steps=1)
                      + ["actor.lora.enabled=true", "actor.lora.r=4"])
    trainer = Trainer(cfg)
    alternating_rewards(trainer)  # reward variance in every group, whatever was sampled
    base_before = {k: v.clone() for k, v in trainer.actor.base_model.state_dict().items()
                   if "lora_" not in k}
    adapters_before = {k: v.clone() for k, v in trainer.actor.trainable_state_dict().items()}
    metrics = trainer.train()
    # not the loss: at ratio 1 (bf16 recomputes the old log-probs) mean-zero advantages sum to 0
    assert metrics["grad_norm/actor"] > 0.0
    after = trainer.actor.trainable_state_dict()
    assert set(after) == set(adapters_before) and all("lora_" in k for k in after)
    assert any(not torch.equal(adapters_before[k], after[k]) for k in after)
    base_after = {k: v for k, v in trainer.actor.base_model.state_dict().items()
                  if "lora_" not in k}
    assert all(torch.equal(base_before[k], base_after[k]) for k in base_before)
    # the checkpoint's actor_hf holds the adapters alone; loaded, they are merged into their
    # base (crl eval, crl demo)
    assert (tmp_path / "checkpoints" / "step-000001" / "actor_hf" / "adapter_config.json").exists()
    from crl_harness.models import HFBackend

    merged = HFBackend(str(tmp_path / "checkpoints" / "step-000001" / "actor_hf"))
    ids = torch.tensor([[3, 17, 42, 5, 9]])
    with torch.no_grad():
        expected = trainer.actor.model(input_ids=ids).logits
        got = merged.model(input_ids=ids).logits
    assert not any("lora_" in k for k in merged.model.state_dict())
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_static_arm_distils_with_its_warm_starts_adapters(models, tmp_path):
    """A static run's frozen extractor is the one its lora.init_from names, merged at load (it
    was once the bare base: a 135M base writes no answer in format, so the bank stayed empty)."""
    from crl_harness.config import LoRAConfig
    from crl_harness.models import HFBackend
    from crl_harness.training.learner import PolicyLearner

    base = str(models[1])
    warm = PolicyLearner(HFBackend(base).model, lr=1e-3, max_grad_norm=1.0, temperature=1.0,
                         micro_batch_size=1, lora=LoRAConfig(enabled=True, r=4, alpha=8))
    torch.manual_seed(0)
    for name, parameter in warm.model.named_parameters():
        if "lora_" in name:
            parameter.data.normal_(std=0.05)
    warm.save_adapter(tmp_path / "warm", base)
    merged = HFBackend(str(tmp_path / "warm")).model.state_dict()
    bare = HFBackend(base).model.state_dict()
    cfg = load_config(None, _overrides(models, tmp_path / "run", arm="static", steps=1) + [
        "extractor.lora.enabled=true", f"extractor.lora.init_from={tmp_path / 'warm'}"])
    trainer = Trainer(cfg)
    try:
        assert trainer.extractor is None  # static: nothing trains it
        used = trainer.experience.backend.model.state_dict()
        changed = [k for k in used if not torch.equal(bare[k], merged[k])]
        assert changed and all(torch.equal(used[k], merged[k]) for k in changed)
    finally:
        trainer.close()


def test_lora_on_a_bf16_base_continues_init_from_and_resumes_from_adapter_only_checkpoints(
        models, tmp_path, alternating_rewards):
    from safetensors.torch import load_file

    from crl_harness.config import LoRAConfig
    from crl_harness.models import HFBackend
    from crl_harness.training.learner import PolicyLearner

    # a warm start's adapters of the actor's base, not zero (fresh ones start with lora_B = 0)
    warm = PolicyLearner(HFBackend(str(models[0])).model, lr=1e-3, max_grad_norm=1.0,
                         temperature=1.0, micro_batch_size=1,
                         lora=LoRAConfig(enabled=True, r=4, alpha=8))
    torch.manual_seed(0)
    for name, parameter in warm.model.named_parameters():
        if "lora_" in name:
            parameter.data.normal_(std=0.05)
    warm.save_adapter(tmp_path / "warm", str(models[0]))
    warm_state = warm.trainable_state_dict()

    run = tmp_path / "run"
    lora = ["actor.dtype=bfloat16", "actor.lora.enabled=true", "actor.lr=1e-3",
            f"actor.lora.init_from={tmp_path / 'warm'}"]
    trainer = Trainer(load_config(None, _overrides(models, run, arm="none", steps=1) + lora))
    start = trainer.actor.trainable_state_dict()
    assert start.keys() == warm_state.keys()
    assert all(torch.equal(start[k], warm_state[k]) for k in start)  # continued, not fresh
    assert trainer.actor.dtype == torch.bfloat16
    base_before = {k: v.clone() for k, v in trainer.actor.base_model.state_dict().items()
                   if "lora_" not in k}
    alternating_rewards(trainer)
    trainer.train()
    after = trainer.actor.trainable_state_dict()
    assert all(v.dtype == torch.float32 for v in after.values())
    assert any(not torch.equal(start[k], after[k]) for k in after)
    base_after = trainer.actor.base_model.state_dict()
    assert all(torch.equal(v, base_after[k]) for k, v in base_before.items())

    # the checkpoint holds the adapters only: no copy of the base model
    checkpoint = run / "checkpoints" / "step-000001"
    actor_hf = checkpoint / "actor_hf"
    assert not (actor_hf / "model.safetensors").exists()
    saved = load_file(actor_hf / "adapter_model.safetensors")
    assert saved and all("lora_" in k for k in saved)
    assert json.loads((actor_hf / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == str(models[0].resolve())
    card = (actor_hf / "README.md").read_text()  # filled, not peft's empty template
    assert "1 steps of crl-gym training (arm none)" in card and "`crl train " in card
    assert "More Information Needed" not in card
    assert all("lora_" in k for k in torch.load(checkpoint / "actor.pt")["model"])
    assert HFBackend(str(actor_hf)).name == f"hf:{actor_hf}"  # crl eval / crl demo load it
    exported = trainer.save_merged_actor(tmp_path / "export")
    assert all(v.dtype == torch.float32
               for v in load_file(exported / "model.safetensors").values())

    # resume from the adapter-only checkpoint: adapters and AdamW state come back, and it trains
    resumed = Trainer(load_config(None, _overrides(models, run, arm="none", steps=2) + lora),
                      resume=True)
    assert resumed.step == 1
    state = resumed.actor.trainable_state_dict()
    assert all(torch.equal(state[k], after[k]) for k in after)
    assert resumed.actor.optimizer.state_dict()["state"].keys() == \
        trainer.actor.optimizer.state_dict()["state"].keys()
    alternating_rewards(resumed)
    resumed.train()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2]
    assert (run / "checkpoints" / "step-000002" / "actor_hf" / "adapter_model.safetensors").exists()


def test_relative_credit_reaches_the_ledger_once_per_guided_use(models, tmp_path):
    """``experience.credit=relative`` end to end: the engine leaves the entries' credit to the
    trainer, which gives each guided use its score minus its group's free mean, once."""
    _, initial_bank = _seed_bank(tmp_path)
    cfg = load_config(None, _overrides(models, tmp_path) + [
        initial_bank, "experience.credit=relative", "extractor.train_after=64"])
    trainer = Trainer(cfg)
    for i in range(3):  # the seeded entries' writers, awaiting credit as a run's own would
        trainer.experience.manager.ledger.register(f"seed-{i}", "prompt", "output", "distill")
    played: list = []
    run = trainer.rollouts.run
    trainer.rollouts.run = lambda specs: played.extend(run(specs)) or played[-len(specs):]
    try:
        trainer.train_step(1)
        score = {id(t): t.outcome_score for t in played}
        free: dict[int, list[float]] = {}
        for t in played:
            if not t.use_experience:
                free.setdefault(t.group_id, []).append(score[id(t)])
        expected: dict[str, list[float]] = {}
        entries = {e.id: e.generation_id for e in trainer.experience.bank.entries("CRL/Sokoban-v0")}
        for t in played:
            # relative to the free mean where the free half is mixed, else the paper's credit
            mixed = len(set(free[t.group_id])) > 1
            credit = score[id(t)] - sum(free[t.group_id]) / len(free[t.group_id]) if mixed \
                else (score[id(t)] if score[id(t)] > 0 else -1.0)
            for entry_id in t.experience_ids:
                expected.setdefault(entries[entry_id], []).append(credit)
        assert expected  # the guided episodes retrieved the seeded entries
        got = {g.generation_id: (g.reward, g.n_uses)
               for g in trainer.experience.manager.generation_rewards()}
        assert got == {g: (pytest.approx(sum(v) / len(v)), len(v)) for g, v in expected.items()}
    finally:
        trainer.close()
