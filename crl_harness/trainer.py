"""The Complementary RL training loop (docs/method.md; the step: docs/design.md), top to bottom.

Holds ``Trainer``. One step:

1. flush the Experience Manager (pending bank updates land before the rollout phase);
2. draw ``groups_per_step`` task seeds from the mixture; G rollouts per seed, the first
   ``guided_per_group`` with retrieved experience, the others without;
3. update the actor with GRPO, advantages inside each (seed, guided/free) subgroup;
4. send the finished guided trajectories to the Experience Manager (the background track
   distils them into the bank with the extractor);
5. read the extractor's generation rewards (each the mean credit of every episode that used
   what the generation wrote, so far; with ``experience.credit: relative`` an episode's credit
   is its score minus its group's free subgroup's mean, reported once step 2 ends); once
   ``train_after`` are waiting, update the extractor with CISPO (arm ``co-evolve`` only) and
   release them;
6. every ``merge_every`` steps, queue a merge pass over the bank;
7. push the new weights to the rollout backend (a no-op in one process: the learners train the
   backends' own models), log metrics, checkpoint every ``checkpoint_every`` steps.

Two warm-ups, one by default as in the released code. Retrieval warm-up, the first
``experience.retrieval_warmup_steps`` steps (null: ``actor.warmup_steps``): nothing is retrieved
while the bank fills; the guided half of each group plays without experience (so nothing is
credited and the extractor is not trained) and is still distilled. Actor warm-up, the first
``actor.warmup_steps`` steps: the actor is frozen (never in arm ``none``, which has no bank).

The released code's switches (``experience.actor_critic_gate``, ``experience.search_and_ask``)
add actor turns to the guided rollouts of step 2 (the gate's verdict, the asks), trained in step 3
with their episode's advantage, and extractor generations (the answers) credited like the others
in step 5; ``gate/*`` and ``ask/*`` metrics log them.

The arm (``co-evolve``, ``static``, ``none``) changes only which of these run.
"""

from __future__ import annotations

import functools
import json
import random
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from crl_harness.config import TrainConfig, config_to_dict, updated_lesson_steps
from crl_harness.eval import paired_difference
from crl_harness.experience import (
    CRITIC_SCORES,
    DistillationRequest,
    GenerationReward,
    episode_credit,
    free_baselines,
    gated_credit,
)
from crl_harness.losses import (
    cispo_loss,
    extractor_advantages,
    grpo_loss,
    sequence_token_weights,
    subgroup_advantages,
)
from crl_harness.models import load_backend
from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory
from crl_harness.training.checkpoint import Checkpointer, rng_state, set_rng_state
from crl_harness.training.experience_service import ExperienceService
from crl_harness.training.learner import PolicyLearner, TrainingRow, UpdateStats
from crl_harness.training.metrics import MetricsLogger, plot_learning_curve, short_env_name
from crl_harness.training.packing import pack_turns
from crl_harness.training.run_directory import ResumeError, RunDirectory, RunDirectoryError
from crl_harness.training.sampler import TaskSampler
from crl_harness.training.vllm_sync import SyncedVLLM

__all__ = ["Trainer", "ResumeError", "RunDirectoryError"]

def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def _guided_free_pairs(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Guided against free inside the same groups, as the counts of a ``PairedDifference``
    (A free, B guided): the j-th guided episode of a group is paired with its j-th free one
    (same level, same weights), so summing the counts over steps and runs pools the pairs."""
    by_group: dict[int, tuple[list[bool], list[bool]]] = defaultdict(lambda: ([], []))
    for t in trajectories:
        by_group[t.group_id][0 if t.use_experience else 1].append(t.won)
    pairs = [(g, f) for guided, free in by_group.values()
             for g, f in zip(guided, free, strict=False)]  # an env failure leaves one unpaired
    d = paired_difference([f for _, f in pairs], [g for g, _ in pairs])
    return {"pairs/guided_free": d.n, "pairs/free_wins": d.a_wins, "pairs/guided_wins": d.b_wins,
            "pairs/free_only": d.only_a, "pairs/guided_only": d.only_b}


def _format_failure_rate(trajectories: Sequence[Trajectory]) -> float:
    """Replies outside the answer format over the turns played."""
    return sum(t.format_failures for t in trajectories) / max(sum(t.steps for t in trajectories), 1)


def _env_metrics(trajectories: Sequence[Trajectory], uses_experience: bool) -> dict[str, float]:
    """Per env of the mixture (``short_env_name``): ``success/ENV``, ``format_failure_rate/ENV``
    (``_format_failure_rate``, as ``rollout/format_failure_rate``) and, in the arms that use
    experience, ``success/ENV/guided`` and ``success/ENV/free``."""
    by_env: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_env[short_env_name(t.env_id)].append(t)
    m: dict[str, float] = {}
    for env, part in by_env.items():
        m[f"success/{env}"] = _mean([float(t.won) for t in part])
        m[f"format_failure_rate/{env}"] = _format_failure_rate(part)
        if uses_experience:
            for name, flag in (("guided", True), ("free", False)):
                m[f"success/{env}/{name}"] = _mean([float(t.won) for t in part
                                                    if t.use_experience == flag])
    return m


def _gate_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The actor-critic gate's verdicts this step: their rates over the gated episodes, the
    malformed verdicts (counted as accept) and the mean credit given to the entries judged."""
    gated = [t for t in trajectories if t.gate is not None]
    m = {f"gate/{verdict}_rate": _mean([float(t.gate.verdict == verdict) for t in gated])
         for verdict in CRITIC_SCORES}
    m["gate/episodes"] = len(gated)
    m["gate/format_failures"] = sum(not t.gate.format_ok for t in gated)
    m["gate/entry_credit"] = _mean([gated_credit(1.0 if t.won else t.score, t.gate.critic)
                                    for t in gated if t.experience_ids])
    return m


def _ask_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Search-and-ask this step: asks per guided episode (answered, refused, empty), queries
    cut, and the mean credit of the extractor generations that answered."""
    guided = [t for t in trajectories if t.use_experience]
    asks = [a for t in guided for a in t.asks]
    m = {"ask/per_episode": _mean([len(t.asks) for t in guided])}
    for status in ("answered", "refused", "empty"):
        m[f"ask/{status}"] = sum(a.status == status for a in asks)
    m["ask/queries_cut"] = sum(a.cut for a in asks)
    m["ask/answer_credit"] = _mean([episode_credit(1.0 if t.won else t.score)
                                    for t in guided for a in t.asks if a.generation_id])
    return m


class Trainer:
    """Runs a ``TrainConfig``: ``Trainer(cfg).train()``; ``resume=True`` continues the run in
    ``cfg.run.output_dir`` from its latest checkpoint (models, optimisers, bank, RNG, step).

    A fresh run refuses a run directory that holds another run, unless ``overwrite`` (which
    deletes that run first); see ``RunDirectory``. ``last_checkpoint`` is the checkpoint this
    run saved last (after ``train()``: its final step's)."""

    def __init__(self, cfg: TrainConfig, *, resume: bool = False, overwrite: bool = False,
                 on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run.output_dir)
        self.on_step = on_step
        if cfg.trains_extractor and updated_lesson_steps(cfg) < 2:
            # A smoke run may be this short on purpose; an experiment should not be.
            warnings.warn(
                f"{cfg.name}: lessons written after the extractor's first update are retrieved in "
                f"{updated_lesson_steps(cfg)} step(s) of this run at the earliest, so co-evolution "
                f"cannot show; give run.steps >= {cfg.run.steps + 2 - updated_lesson_steps(cfg)} "
                "(docs/experience.md, Credit and schedule)", stacklevel=2)
        # Refused (live, or another run's folder) before anything loads or changes on disk.
        self.run = (RunDirectory.reopen(self.run_dir) if resume
                    else RunDirectory.create(self.run_dir, overwrite=overwrite))
        try:
            self._build(resume)
        except BaseException:
            if resume:  # the resumed run's folder stays as it was
                self.run.close()
            else:  # a fresh run that never started leaves the folder free
                self.run.discard()
            raise

    def _build(self, resume: bool) -> None:
        cfg = self.cfg
        if cfg.run.torch_threads:
            torch.set_num_threads(cfg.run.torch_threads)
        self._seed_everything(cfg.run.seed)
        self.checkpoints = Checkpointer(self.run_dir, self.run.run_id,
                                        keep=cfg.run.keep_checkpoints)
        self.last_checkpoint: Path | None = None
        checkpoint = self._checkpoint_to_resume() if resume else None
        if not resume and cfg.experience.initial_bank and cfg.uses_experience \
                and not Path(cfg.experience.initial_bank).is_file():
            raise RunDirectoryError(f"experience.initial_bank {cfg.experience.initial_bank}: no "
                                    "such file; give a bank.jsonl (e.g. a checkpoint's).")
        (self.run_dir / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=2))

        # The actor: a learner that trains a transformers model, and what its rollouts generate
        # with: that same model (rollout_engine hf) or a vLLM engine synced after each update.
        self.engines: dict[str, SyncedVLLM] = {}
        learner_backend = load_backend(cfg.actor.model, dtype=cfg.actor.dtype,
                                       kv_cache_tokens=cfg.actor.kv_cache_tokens,
                                       kv_reuse=cfg.actor.rollout_engine == "hf")
        self.tokenizer = learner_backend.tokenizer
        self.actor = self._learner("actor", learner_backend.model)
        self.actor_backend = self._sampler("actor", learner_backend)

        # The extractor and the bank (not in the arm without experience).
        self.experience: ExperienceService | None = None
        self.extractor: PolicyLearner | None = None
        if cfg.uses_experience:
            spec = cfg.actor.model if cfg.extractor.model == "same" else cfg.extractor.model
            vllm_static = cfg.extractor.rollout_engine == "vllm" and not cfg.trains_extractor
            # with "same": a second copy of the base model
            extractor_backend = load_backend(
                ("vllm:" + spec.removeprefix("hf:")) if vllm_static else spec,
                dtype=cfg.extractor.dtype, kv_cache_tokens=cfg.kv_cache_tokens("extractor"))
            if cfg.trains_extractor:
                self.extractor = self._learner("extractor", extractor_backend.model)
                extractor_backend = self._sampler("extractor", extractor_backend)
            self.experience = self._make_experience(extractor_backend, checkpoint)
        self.rollouts = self._make_rollouts()
        self.sampler = TaskSampler(cfg.tasks, cfg.run.seed)
        self.awaiting_training = 0  # used extractor generations not trained yet
        self.counters: dict[str, float] = defaultdict(float)
        self.step = 0
        if checkpoint is not None:
            self._load_checkpoint(checkpoint)
        self.metrics = MetricsLogger(self.run_dir, tensorboard=cfg.run.tensorboard,
                                     resume_step=self.step if resume else None)

    def _learner(self, role: str, model: Any) -> PolicyLearner:
        settings = getattr(self.cfg, role)
        recompute = settings.recompute_old_logprobs
        if recompute is None and settings.rollout_engine == "vllm":
            recompute = True  # another engine's log-probs differ from the learner's at any dtype
        return PolicyLearner(
            model, lr=settings.lr, max_grad_norm=settings.max_grad_norm,
            temperature=settings.temperature, micro_batch_size=settings.micro_batch_size,
            lora=settings.lora, recompute_old_logprobs=recompute)

    def _sampler(self, role: str, learner_backend: Any) -> Any:
        """The backend ``role`` generates with: the learner's own (hf), or a vLLM engine started
        from the learner's weights (vllm; ``self.engines[role]``, synced in step 7)."""
        if getattr(self.cfg, role).rollout_engine != "vllm":
            return learner_backend
        engine = SyncedVLLM(getattr(self, role), learner_backend.tokenizer,
                            max_context=learner_backend.max_context,
                            kv_cache_tokens=self.cfg.kv_cache_tokens(role), seed=self.cfg.run.seed)
        self.engines[role] = engine
        return engine.backend

    # ================================================================== the loop
    def train(self) -> dict[str, float]:
        """Run the remaining steps; returns the last step's metrics."""
        last: dict[str, float] = {}
        try:
            while self.step < self.cfg.run.steps:
                self.step += 1
                last = self.train_step(self.step)
                self.metrics.log(self.step, last)
                if self.on_step is not None:
                    self.on_step(self.step, last)
                if self.step % self.cfg.run.checkpoint_every == 0 or self.step == self.cfg.run.steps:
                    self.save_checkpoint()
            plot_learning_curve(self.metrics.path, self.run_dir / "learning_curve.png",
                                title=f"{self.cfg.name} (arm: {self.cfg.arm})")
        finally:
            self.close()
        return last

    def train_step(self, step: int) -> dict[str, float]:
        cfg, times = self.cfg, {}

        # 1. Pending bank updates land before the rollout phase.
        t0 = time.perf_counter()
        if self.experience is not None:
            self.experience.flush()
        times["flush"] = time.perf_counter() - t0

        # 2. Rollouts: G per task seed, the first guided_per_group of each group with experience
        #    (after the retrieval warm-up: during it nothing is retrieved).
        retrieving = step > cfg.retrieval_warmup
        actor_frozen = step <= cfg.actor_warmup
        t0 = time.perf_counter()
        specs = self._episode_specs(step, retrieve=retrieving)
        results = self.rollouts.run(specs)
        trajectories = [t for t in results if not t.error]
        times["rollout"] = time.perf_counter() - t0
        if self.experience is not None and cfg.experience.credit == "relative":
            self._credit_relative(trajectories)

        # 3. Finished trajectories of the guided slots go to the Experience Manager at once: their
        #    distillation runs in the background while the actor trains (the two tracks of
        #    docs/method.md); during the retrieval warm-up they played without experience, and
        #    fill the bank.
        if self.experience is not None:
            G, guided = cfg.tasks.group_size, cfg.tasks.guided_per_group
            self.experience.submit([
                DistillationRequest(t.env_id, t.task, t.transcript, t.won, t.score,
                                    list(t.experience_ids), step)
                for i, t in enumerate(results) if i % G < guided and not t.error])

        # 4. Actor: GRPO with advantages inside each subgroup, frozen during its warm-up.
        t0 = time.perf_counter()
        actor_stats = None
        if not actor_frozen:
            actor_stats = self.actor.update(
                self._actor_rows(trajectories),
                functools.partial(grpo_loss, clip_eps=cfg.actor.clip_eps))
        times["actor_update"] = time.perf_counter() - t0

        # 5. Extractor: each used generation's reward is the mean credit of all the episodes
        #    that used what it wrote so far; it waits, still collecting credit, until trained.
        t0 = time.perf_counter()
        extractor_stats = None
        if self.experience is not None and retrieving:
            extractor_stats = self._extractor_step()
        times["extractor_update"] = time.perf_counter() - t0

        # 6. Merge pass over every partition of the bank.
        if self.experience is not None and step % cfg.experience.merge_every == 0:
            self.counters["bank/merge_chunks"] += self.experience.merge_pass()

        # 7. New weights reach the rollout backend and the extractor's generator.
        t0 = time.perf_counter()
        self._push_weights(actor_stats is not None and actor_stats.rows > 0,
                           extractor_stats is not None and extractor_stats.rows > 0)
        times["sync"] = time.perf_counter() - t0
        self._check_logprob_gap(actor_stats, extractor_stats)
        metrics = self._step_metrics(trajectories, actor_stats, extractor_stats, times)
        metrics["actor/warmup"] = float(actor_frozen)
        if self.experience is not None:
            metrics["experience/warmup"] = float(not retrieving)
        return metrics

    def _check_logprob_gap(self, *stats: UpdateStats | None) -> None:
        """Say so when a learner's log-probs of the trained tokens stray from the sampler's by
        more than ``max_logprob_gap`` on average: the sampler is not running its weights."""
        for role, update in zip(("actor", "extractor"), stats, strict=True):
            bound = getattr(self.cfg, role).max_logprob_gap
            if update is not None and update.rows and update.logprob_gap_mean > bound:
                warnings.warn(
                    f"step {self.step}: the {role}'s sampler and learner disagree by "
                    f"{update.logprob_gap_mean:.3f} nats a token on average (bound {role}."
                    f"max_logprob_gap = {bound}); the rollouts ran other weights than the "
                    "learner's (a missed weight sync, or a lossy dtype)", stacklevel=2)

    # ================================================================== steps of the loop
    def _episode_specs(self, step: int, retrieve: bool = True) -> list[EpisodeSpec]:
        """G specs per drawn seed, in order; slot j < guided_per_group of a group is the guided
        one (it retrieves when ``retrieve``)."""
        t = self.cfg.tasks
        guided = t.guided_per_group if self.cfg.uses_experience and retrieve else 0
        return [
            EpisodeSpec(draw.env_id, draw.seed, group_id=index, use_experience=j < guided,
                        options=dict(t.envs[draw.env_index].options) or None)
            for index, draw in enumerate(self.sampler.sample(step))
            for j in range(t.group_size)
        ]

    def _actor_rows(self, trajectories: list[Trajectory]) -> list[TrainingRow]:
        """One row per trajectory when its prompts only grow (``pack_turns``), else one per
        turn; either way every row of a trajectory carries its token weight, the trajectory
        being the sequence of "sequence-mean then batch-mean"."""
        self.packed_fraction = float("nan")  # of the trajectories trained this step
        if not trajectories:
            return []
        advantages = subgroup_advantages(
            [t.reward for t in trajectories],
            [(t.group_id, t.use_experience) for t in trajectories],
            normalize_std=self.cfg.actor.normalize_std)
        weights = sequence_token_weights(
            torch.tensor([t.generated_tokens for t in trajectories]))
        rows, trained, packed = [], 0, 0
        for traj, advantage, weight in zip(trajectories, advantages.tolist(), weights.tolist(),
                                           strict=True):
            if advantage == 0.0:  # contributes exactly nothing to the loss or its gradient
                continue
            parts = pack_turns(traj.turns)
            trained += bool(parts)
            packed += bool(parts) and parts[0].packed
            # The gate's verdict is a chat of its own (not a prefix of the episode's): one more
            # row, with the episode's advantage, so the actor learns to judge experience too.
            if traj.gate is not None:
                parts += pack_turns([traj.gate.turn])
            rows.extend(TrainingRow(p.prompt_ids, p.completion_ids, p.old_logprobs, advantage,
                                    weight, p.completion_mask) for p in parts)
        if trained:
            self.packed_fraction = packed / trained
        return rows

    def _credit_relative(self, trajectories: list[Trajectory]) -> None:
        """``experience.credit: relative``: each guided episode shown entries credits their
        writers with its score minus its group's free subgroup's mean score (the engine, which
        credits an episode as it ends, left them to this step: the group had to finish)."""
        assert self.experience is not None
        score = {id(t): 1.0 if t.won else t.score for t in trajectories}
        baselines = free_baselines((t.group_id, t.use_experience, score[id(t)])
                                   for t in trajectories)
        for t in trajectories:
            if t.use_experience and t.experience_ids and t.group_id in baselines:
                self.experience.report_outcome(
                    list(t.experience_ids), score[id(t)],
                    t.gate.critic if t.gate is not None else None, baselines[t.group_id])

    def _extractor_step(self) -> UpdateStats | None:
        """Train the extractor once ``train_after`` used generations wait, then release them."""
        assert self.experience is not None
        waiting = self.experience.generation_rewards()
        if self.extractor is None:  # static arm: nothing trains on them, so none is kept
            self._release(waiting)
            return None
        if len(waiting) < self.cfg.extractor.train_after:
            self.awaiting_training = len(waiting)
            return None
        stats = self._update_extractor(waiting)
        self._release(waiting)
        return stats

    def _release(self, generations: list[GenerationReward]) -> None:
        assert self.experience is not None
        self.experience.release_generations([g.generation_id for g in generations])
        self.counters["extractor/generations_rewarded"] += len(generations)
        self.awaiting_training = 0

    def _update_extractor(self, buffer: list[GenerationReward]) -> UpdateStats | None:
        """CISPO on ``buffer``: one sample per generation and A = reward - batch mean
        (docs/method.md), or, with ``extractor.repeat_by_uses``, each generation counted once per
        use."""
        usable = [g for g in buffer if getattr(g.output, "token_ids", None)]
        if not usable:
            return None
        uses = [max(g.n_uses, 1) if self.cfg.extractor.repeat_by_uses else 1 for g in usable]
        advantages = extractor_advantages([g.reward for g in usable], uses)
        sequence_weight = torch.tensor(uses, dtype=torch.float32) / sum(uses)
        weights = sequence_token_weights(
            torch.tensor([len(g.output.token_ids) for g in usable]), sequence_weight)
        rows = [TrainingRow(g.output.prompt_token_ids, g.output.token_ids, g.output.logprobs,
                            a, w)
                for g, a, w in zip(usable, advantages.tolist(), weights.tolist(), strict=True)
                if a != 0.0]
        loss = functools.partial(cispo_loss, eps_low=self.cfg.extractor.eps_low,
                                 eps_high=self.cfg.extractor.eps_high)
        assert self.experience is not None and self.extractor is not None
        with self.experience.weights_lock:  # no extractor call sees half an update
            stats = self.extractor.update(rows, loss)
        self.counters["extractor/updates"] += int(stats.rows > 0)
        self.counters["extractor/nonzero_advantages"] += len(rows)
        return stats

    def _step_metrics(self, trajectories: list[Trajectory], actor: UpdateStats | None,
                      extractor: UpdateStats | None, times: dict[str, float]) -> dict[str, float]:
        cfg, m = self.cfg, {}
        won = [float(t.won) for t in trajectories]
        m["success/all"] = _mean(won)
        m["episodes/all"] = len(won)  # with the rates, pooled intervals over runs
        m["reward/all"] = _mean([t.reward for t in trajectories])
        if self.cfg.uses_experience:
            for name, flag in (("guided", True), ("free", False)):
                part = [t for t in trajectories if t.use_experience == flag]
                m[f"success/{name}"] = _mean([float(t.won) for t in part])
                m[f"episodes/{name}"] = len(part)
                m[f"reward/{name}"] = _mean([t.reward for t in part])
            m.update(_guided_free_pairs(trajectories))
        m.update(_env_metrics(trajectories, cfg.uses_experience))
        m["rollout/format_failure_rate"] = _format_failure_rate(trajectories)
        m["rollout/generated_tokens"] = sum(t.generated_tokens for t in trajectories)
        m["rollout/episodes"] = len(trajectories)
        if actor is not None:
            m["loss/actor"] = actor.loss
            m["clip/actor"] = actor.clip_fraction
            m["grad_norm/actor"] = actor.grad_norm
            # sampler vs learner log-probs of the trained tokens, before the step
            m["actor/logprob_gap_mean"] = actor.logprob_gap_mean
            m["actor/logprob_gap_max"] = actor.logprob_gap_max
            m["actor/logprob_gap_over_bound"] = float(
                actor.logprob_gap_mean > cfg.actor.max_logprob_gap)
            # trajectories trained as one packed row (the rest: one row per turn)
            m["actor/packed_fraction"] = self.packed_fraction
        if extractor is not None:
            m["loss/extractor"] = extractor.loss
            m["clip/extractor"] = extractor.clip_fraction
            m["grad_norm/extractor"] = extractor.grad_norm
            m["extractor/trained_generations"] = extractor.rows
            m["extractor/logprob_gap_mean"] = extractor.logprob_gap_mean
            m["extractor/logprob_gap_max"] = extractor.logprob_gap_max
            m["extractor/logprob_gap_over_bound"] = float(
                extractor.logprob_gap_mean > cfg.extractor.max_logprob_gap)
        if self.experience is not None:
            stats = self.experience.stats()
            m["bank/size"] = stats["bank_size"]
            m["extractor/format_failures"] = stats["format_failures"]
            m["extractor/distillations"] = stats["distillations"]
            m["extractor/buffered"] = self.awaiting_training
            m["experience/retrieved_per_guided"] = _mean(
                [len(t.experience_ids) for t in trajectories if t.use_experience])
            if cfg.experience.actor_critic_gate:
                m.update(_gate_metrics(trajectories))
            if cfg.experience.search_and_ask:
                m.update(_ask_metrics(trajectories))
                m["extractor/ask_format_failures"] = stats["ask_format_failures"]
        m.update(self.counters)
        for key, value in times.items():
            m[f"time/{key}"] = value
        return m

    # ================================================================== checkpoints
    def save_checkpoint(self) -> Path:
        """Atomically write models, optimisers, bank, extractor buffer, RNG states and step."""
        self.last_checkpoint = self.checkpoints.save(self.step, self._write_checkpoint)
        return self.last_checkpoint

    def _write_checkpoint(self, directory: Path) -> None:
        torch.save({"model": self.actor.trainable_state_dict(), **self.actor.optimizer_state()},
                   directory / "actor.pt")
        if self.extractor is not None:
            torch.save({"model": self.extractor.trainable_state_dict(),
                        **self.extractor.optimizer_state()}, directory / "extractor.pt")
        # The generations awaiting training (with their credit so far) are in the ledger export.
        bank_entries = self.experience.export_state(directory) if self.experience else 0
        torch.save({"rng": rng_state(), "awaiting_training": self.awaiting_training},
                   directory / "trainer_state.pt")
        # The actor for `crl eval hf:DIR`: its LoRA adapters alone (fp32, megabytes; loaded
        # merged into their base) when its base is a plain model, else a plain transformers
        # checkpoint (full fine-tuning, or fresh adapters on an adapter folder merged at load).
        base = self._actor_adapter_base()
        if base is not None:
            self.actor.save_adapter(directory / "actor_hf", base)
        else:
            self.actor.save_merged(directory / "actor_hf")
        self.tokenizer.save_pretrained(directory / "actor_hf")
        (directory / "state.json").write_text(json.dumps({
            "step": self.step, "name": self.cfg.name, "arm": self.cfg.arm,
            "bank_entries": bank_entries, "counters": dict(self.counters),
        }, indent=2))

    def _actor_adapter_base(self) -> str | None:
        """The base model a checkpoint's actor adapters name (``actor.model``: a short name or
        a shipped ``assets/...`` path as written, another local path made absolute), or None
        when the actor trains no adapters or its model is an adapter folder merged at load."""
        from crl_harness.models.model_folder import is_adapter_folder
        from crl_harness.models.names import MODELS, resolve_model_path

        if self.actor.lora is None:
            return None
        name = self.cfg.actor.model.removeprefix("hf:")
        path = Path(resolve_model_path(name)).expanduser()
        if is_adapter_folder(path):
            return None
        if name in MODELS or name.startswith("assets/") or not path.exists():
            return name
        return str(path.resolve())

    def save_merged_actor(self, directory: Path) -> Path:
        """Export the actor as one plain transformers model, LoRA adapters merged in fp32
        (``crl eval`` and vLLM read it without peft)."""
        directory = Path(directory)
        self.actor.save_merged(directory)
        self.tokenizer.save_pretrained(directory)
        return directory

    def _checkpoint_to_resume(self) -> Path:
        checkpoint = self.checkpoints.latest()
        if checkpoint is None:
            raise ResumeError(f"--resume: no checkpoint of run {self.run.run_id} under "
                              f"{self.checkpoints.root}; start over with --overwrite.")
        state = json.loads((checkpoint / "state.json").read_text())
        if state["arm"] != self.cfg.arm:
            raise ResumeError(f"{checkpoint} is a checkpoint of arm '{state['arm']}', not "
                              f"'{self.cfg.arm}'; resume with the same config.")
        return checkpoint

    def _load_checkpoint(self, checkpoint: Path) -> None:
        state = json.loads((checkpoint / "state.json").read_text())
        # Loaded to the CPU: a run checkpointed on a GPU resumes anywhere; the learners copy
        # weights and AdamW's state onto their parameters' device.
        actor = torch.load(checkpoint / "actor.pt", map_location="cpu", weights_only=False)
        self.actor.load_trainable_state_dict(actor["model"])
        self.actor.load_optimizer_state(actor)
        if self.extractor is not None:
            extractor = torch.load(checkpoint / "extractor.pt", map_location="cpu",
                                   weights_only=False)
            self.extractor.load_trainable_state_dict(extractor["model"])
            self.extractor.load_optimizer_state(extractor)
        if self.experience is not None:
            self.experience.import_ledger(checkpoint)
        trainer_state = torch.load(checkpoint / "trainer_state.pt", map_location="cpu",
                                   weights_only=False)
        self.awaiting_training = int(trainer_state.get("awaiting_training", 0))
        set_rng_state(trainer_state["rng"])
        self.counters.update(state["counters"])
        self.step = int(state["step"])

    # ================================================================== where things run
    # One process here; ``crl_harness.training.ray_backend.RayTrainer`` moves the rollouts and
    # the experience service into Ray actors by overriding these three methods.
    def _prepare_bank(self, checkpoint: Path | None) -> None:
        """The bank a run starts from: a resumed run's checkpoint's, else
        ``experience.initial_bank``'s entries, else none (a fresh run's folder holds no bank)."""
        source = checkpoint or self.cfg.experience.initial_bank
        if source:
            ExperienceService.restore_bank(self.run_dir, source, self.cfg.experience.capacity)

    def _make_experience(self, extractor_backend: Any, checkpoint: Path | None) -> Any:
        """The bank and its manager; the extractor generates with the learner's own model."""
        self._prepare_bank(checkpoint)
        return ExperienceService(
            self.run_dir, self.cfg.experience, extractor_backend,
            max_new_tokens=self.cfg.extractor.max_new_tokens,
            temperature=self.cfg.extractor.temperature, top_p=self.cfg.extractor.top_p,
            seed=self.cfg.run.seed, format_failure_reward=self.cfg.extractor.format_penalty)

    def _make_rollouts(self) -> Any:
        return RolloutEngine(self.actor_backend, retriever=self.experience,
                             config=self._rollout_config())

    def _push_weights(self, actor_updated: bool, extractor_updated: bool) -> None:
        """In one process an hf engine needs nothing (the learner trained its model in place);
        a vLLM engine is given the learner's new weights."""
        if actor_updated and "actor" in self.engines:
            self.engines["actor"].sync()
        if extractor_updated and "extractor" in self.engines:
            assert self.experience is not None
            with self.experience.weights_lock:  # no distillation sees half an update
                self.engines["extractor"].sync()

    # ================================================================== plumbing
    def _rollout_config(self) -> RolloutConfig:
        cfg = self.cfg
        env_kwargs: dict[str, dict[str, Any]] = {}
        for entry in cfg.tasks.envs:
            if entry.id in env_kwargs and env_kwargs[entry.id] != entry.kwargs:
                raise ValueError(f"tasks.envs lists {entry.id} twice with different kwargs; "
                                 "the rollout engine keeps one set of kwargs per env id.")
            env_kwargs[entry.id] = dict(entry.kwargs)
        return RolloutConfig(
            max_new_tokens=cfg.actor.max_new_tokens, temperature=cfg.actor.temperature,
            top_p=cfg.actor.top_p, history=cfg.actor.history,
            format_penalty=cfg.actor.format_penalty, max_live=cfg.tasks.groups_per_step * cfg.tasks.group_size,
            credit_entries=cfg.experience.credit == "outcome",
            workers=cfg.run.rollout_workers, experience_k=cfg.experience.k,
            actor_critic_gate=cfg.experience.actor_critic_gate,
            search_and_ask=cfg.experience.search_and_ask, max_asks=cfg.experience.max_asks,
            max_query_chars=cfg.experience.max_query_chars,
            # seed=None: sampling draws from torch's global RNG, which checkpoints carry.
            seed=None, env_kwargs=env_kwargs)

    @staticmethod
    def _seed_everything(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def close(self) -> None:
        """Stop the background track and free the envs; the metrics file stays complete."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self.rollouts.close()
        if self.experience is not None:
            self.experience.close()
        for engine in getattr(self, "engines", {}).values():
            engine.close()
        self.metrics.close()
        self.run.close()
