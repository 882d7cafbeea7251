"""The Complementary RL training loop (docs/method.md; the step: docs/design.md), top to bottom.

Holds ``Trainer``, the loop; the parts it is handed are in ``crl_harness.training``: where they
run (``placement``: one process, or Ray actors, chosen by the command), the rows the learners
train on (``batches``), the learners (``learner``), what a step logs (``step_metrics``,
``metrics``), checkpoints and resuming (``checkpoint``). One step:

1. flush the Experience Manager (pending bank updates land before the rollout phase);
2. draw ``groups_per_step`` task seeds from the mixture; G rollouts per seed, the first
   ``guided_per_group`` with retrieved experience, the others without;
3. update the actor with GRPO, advantages inside each (seed, guided/free) subgroup;
4. send the finished guided trajectories to the Experience Manager (the background track
   distils them into the bank with the extractor);
5. read the extractor's generation rewards (each the mean credit of every episode that used
   what the generation wrote, so far; with ``experience.credit: relative`` an episode's credit
   is its score minus its group's free subgroup's mean, reported once step 2 ends); once
   ``train_after`` are waiting (on the run's last step: any), update the extractor with CISPO
   (arm ``co-evolve`` only) and release them;
6. every ``merge_every`` steps, queue a merge pass over the bank;
7. push the new weights to whatever generates with a copy of them (the placement's work; a
   no-op in one process with ``rollout_engine: hf``: the learners train the backends' own
   models), log metrics, checkpoint every ``checkpoint_every`` steps.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from crl_harness.config import TrainConfig, config_to_dict, updated_lesson_steps
from crl_harness.experience import (
    DistillationRequest,
    EpisodeOutcome,
    ExperienceOwner,
    GenerationReward,
    episodes_to_distill,
)
from crl_harness.experience.checkpoint import restore_bank
from crl_harness.models import load_backend
from crl_harness.models.engines import resolve_rollout_engines, sampling_engine
from crl_harness.rollout import EpisodeSpec
from crl_harness.training.batches import actor_rows
from crl_harness.training.checkpoint import (
    Checkpointer,
    RunState,
    checkpoint_to_resume,
    load_checkpoint,
    save_merged_actor,
    write_checkpoint,
)
from crl_harness.training.learner import PolicyLearner, TrainingRow, UpdateStats
from crl_harness.training.lesson_replay import LessonReplay
from crl_harness.training.losses import (
    cispo_loss,
    extractor_advantages,
    grpo_loss,
    sequence_token_weights,
)
from crl_harness.training.metrics import MetricsLogger, plot_learning_curve
from crl_harness.training.placement import LocalPlacement, Placement
from crl_harness.training.run_directory import ResumeError, RunDirectory, RunDirectoryError
from crl_harness.training.sampler import TaskDraw, TaskSampler
from crl_harness.training.step_metrics import step_metrics

__all__ = ["Trainer", "ResumeError", "RunDirectoryError"]


class Trainer:
    """Runs a ``TrainConfig``: ``Trainer(cfg).train()``; ``resume=True`` continues the run in
    ``cfg.run.output_dir`` from its latest checkpoint (models, optimisers, bank, RNG, step).

    ``placement`` says where the rollouts, the experience service and the sampling backends run
    (``LocalPlacement``, the default: this process; ``ray_backend.RayPlacement``: Ray actors);
    the trainer closes it. A fresh run refuses a run directory that holds another run, unless
    ``overwrite`` (which deletes that run first); see ``RunDirectory``. ``last_checkpoint`` is
    the checkpoint this run saved last (after ``train()``: its final step's)."""

    def __init__(self, cfg: TrainConfig, *, placement: Placement | None = None,
                 resume: bool = False, overwrite: bool = False,
                 on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        self.cfg = cfg
        self.placement: Placement = placement if placement is not None else LocalPlacement()
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
        try:
            self.run = (RunDirectory.reopen(self.run_dir) if resume
                        else RunDirectory.create(self.run_dir, overwrite=overwrite))
        except BaseException:
            self.placement.close()
            raise
        try:
            self._build(resume)
        except BaseException:
            self.placement.close()
            if resume:  # the resumed run's folder stays as it was
                self.run.close()
            else:  # a fresh run that never started leaves the folder free
                self.run.discard()
            raise

    def _build(self, resume: bool) -> None:
        cfg = self.cfg
        resolve_rollout_engines(cfg)  # rollout_engine auto: hf or vllm, before anything reads it
        if cfg.run.torch_threads:
            torch.set_num_threads(cfg.run.torch_threads)
        self._seed_everything(cfg.run.seed)
        self.checkpoints = Checkpointer(self.run_dir, self.run.run_id,
                                        keep=cfg.run.keep_checkpoints)
        self.last_checkpoint: Path | None = None
        checkpoint = checkpoint_to_resume(self.checkpoints, cfg.arm) if resume else None
        if not resume and cfg.experience.initial_bank and cfg.uses_experience \
                and not Path(cfg.experience.initial_bank).is_file():
            raise RunDirectoryError(f"experience.initial_bank {cfg.experience.initial_bank}: no "
                                    "such file; give a bank.jsonl (e.g. a checkpoint's).")
        (self.run_dir / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=2))

        # The actor: a learner that trains a transformers model, and what its rollouts generate
        # with: that same model (rollout_engine hf) or a vLLM engine synced after each update.
        learner_backend = load_backend(cfg.actor.model, dtype=cfg.actor.dtype,
                                       kv_cache_tokens=cfg.kv_cache_tokens("actor"),
                                       kv_reuse=sampling_engine(cfg.actor.rollout_engine).own_model)
        self.tokenizer = learner_backend.tokenizer
        self.actor = self._learner("actor", learner_backend.model)
        self.actor_backend = self.placement.sampling_backend(cfg, "actor", self.actor,
                                                             learner_backend)

        # The extractor and the bank (not in the arm without experience).
        self.experience: ExperienceOwner | None = None
        self.extractor: PolicyLearner | None = None
        if cfg.uses_experience:
            # co-evolve: the base, which the learner puts its adapters (lora.init_from) on;
            # static: the frozen extractor itself, its warm start's adapters merged at load
            spec = ((cfg.actor.model if cfg.extractor.model == "same" else cfg.extractor.model)
                    if cfg.trains_extractor else cfg.starting_model("extractor"))
            engine = sampling_engine(cfg.extractor.rollout_engine)
            # a frozen extractor loads on its engine; with "same": a second copy of the base
            extractor_backend = load_backend(
                spec if cfg.trains_extractor or engine.own_model else engine.spec(spec),
                dtype=cfg.extractor.dtype, kv_cache_tokens=cfg.kv_cache_tokens("extractor"))
            if cfg.trains_extractor:
                self.extractor = self._learner("extractor", extractor_backend.model)
                extractor_backend = self.placement.sampling_backend(
                    cfg, "extractor", self.extractor, extractor_backend)
            self._prepare_bank(checkpoint)
            self.experience = self.placement.experience(cfg, self.run_dir, extractor_backend,
                                                        spec, self.extractor)
        self.rollouts = self.placement.rollouts(cfg, self.actor_backend, self.experience)
        self.lesson_replay = LessonReplay({e.id: dict(e.kwargs) for e in cfg.tasks.envs},
                                          {e.id: dict(e.options) for e in cfg.tasks.envs}) \
            if cfg.uses_experience else None
        self.sampler = TaskSampler(cfg.tasks, cfg.run.seed)
        self.awaiting_training = 0  # used extractor generations not trained yet
        self.counters: dict[str, float] = defaultdict(float)
        self.step = 0
        if checkpoint is not None:
            resumed = load_checkpoint(checkpoint, actor=self.actor, extractor=self.extractor,
                                      experience=self.experience)
            self.awaiting_training, self.step = resumed.awaiting_training, resumed.step
            self.counters.update(resumed.counters)
        self.metrics = MetricsLogger(self.run_dir, tensorboard=cfg.run.tensorboard,
                                     resume_step=self.step if resume else None)

    def _learner(self, role: str, model: Any) -> PolicyLearner:
        settings = getattr(self.cfg, role)
        recompute = settings.recompute_old_logprobs
        if recompute is None and not sampling_engine(settings.rollout_engine).own_model:
            recompute = True  # another engine's log-probs differ from the learner's at any dtype
        return PolicyLearner(
            model, lr=settings.lr, max_grad_norm=settings.max_grad_norm,
            temperature=settings.temperature, micro_batch_size=settings.micro_batch_size,
            lora=settings.lora, recompute_old_logprobs=recompute)

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
        draws = self.sampler.sample(step)
        specs = self._episode_specs(draws, retrieve=retrieving)
        results = self.rollouts.run(specs)
        trajectories = [t for t in results if not t.error]
        times["rollout"] = time.perf_counter() - t0
        if self.experience is not None:  # the entries' writers and the asks' generations
            self.experience.credit([EpisodeOutcome.of(t) for t in trajectories],
                                   relative=cfg.experience.credit == "relative")

        # 3. The finished trajectories that teach go to the Experience Manager at once, at most
        #    one per guided slot of a group: those shown a lesson and the shortest win, free or
        #    guided (``episodes_to_distill``); their distillation runs in the background while
        #    the actor trains (the two tracks of docs/method.md).
        if self.experience is not None:
            self.experience.submit([
                DistillationRequest(t.env_id, t.task, t.transcript, t.won, t.score,
                                    list(t.experience_ids), step, t.retrieval_key or t.task)
                for t in episodes_to_distill(trajectories, cfg.tasks.guided_per_group)])

        # 4. Actor: GRPO with advantages inside each subgroup, frozen during its warm-up.
        t0 = time.perf_counter()
        actor_stats, packed_fraction = None, float("nan")
        if not actor_frozen:
            rows, packed_fraction = actor_rows(trajectories, normalize_std=cfg.actor.normalize_std)
            actor_stats = self.actor.update(
                rows, functools.partial(grpo_loss, clip_eps=cfg.actor.clip_eps))
        times["actor_update"] = time.perf_counter() - t0

        # 5. Extractor: each used generation's reward is the mean credit of all the episodes
        #    that used what it wrote so far; it waits, still collecting credit, until trained.
        t0 = time.perf_counter()
        extractor_stats = None
        if self.experience is not None and retrieving:
            extractor_stats = self._extractor_step(last=step == cfg.run.steps)
        times["extractor_update"] = time.perf_counter() - t0

        # 6. Merge pass over every partition of the bank.
        if self.experience is not None and cfg.experience.merge_every \
                and step % cfg.experience.merge_every == 0:
            self.counters["bank/merge_chunks"] += self.experience.merge_pass()

        # 7. New weights reach the rollout backend and the extractor's generator.
        t0 = time.perf_counter()
        self.placement.push_weights(actor_stats is not None and actor_stats.rows > 0,
                                    extractor_stats is not None and extractor_stats.rows > 0)
        times["sync"] = time.perf_counter() - t0
        self._check_logprob_gap(actor_stats, extractor_stats)
        metrics = step_metrics(
            cfg, trajectories, actor_stats, extractor_stats, times,
            experience_stats=self.experience.stats() if self.experience is not None else None,
            awaiting_training=self.awaiting_training, packed_fraction=packed_fraction,
            counters=self.counters,
            revisits={index for index, draw in enumerate(draws) if draw.revisit})
        if self.lesson_replay is not None:  # M-b: do the handed lessons win replayed?
            metrics.update(self.lesson_replay.step_metrics(trajectories))
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
    def _episode_specs(self, draws: list[TaskDraw], retrieve: bool = True) -> list[EpisodeSpec]:
        """G specs per drawn seed, in order; slot j < guided_per_group of a group is a guided
        one (``EpisodeSpec.guided``; it retrieves when ``retrieve``), the others free."""
        t = self.cfg.tasks
        guided = t.guided_per_group if self.cfg.uses_experience else 0
        return [
            EpisodeSpec(draw.env_id, draw.seed, group_id=index, guided=j < guided,
                        use_experience=retrieve and j < guided,
                        options=dict(t.envs[draw.env_index].options) or None)
            for index, draw in enumerate(draws)
            for j in range(t.group_size)
        ]

    def _extractor_step(self, last: bool = False) -> UpdateStats | None:
        """Train the extractor once ``train_after`` used generations wait, then release them;
        on the run's ``last`` step on whatever waits, so no credit the run earned is dropped."""
        assert self.experience is not None
        waiting = self.experience.generation_rewards()
        if self.extractor is None:  # static arm: nothing trains on them, so none is kept
            self._release(waiting)
            return None
        if len(waiting) < (1 if last else self.cfg.extractor.train_after):
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

    # ================================================================== checkpoints
    # What a checkpoint holds, and resuming from one: ``crl_harness.training.checkpoint``.
    def save_checkpoint(self) -> Path:
        """Atomically write models, optimisers, bank, extractor buffer, RNG states and step."""
        state = RunState(self.step, self.awaiting_training, dict(self.counters))
        self.last_checkpoint = self.checkpoints.save(self.step, functools.partial(
            write_checkpoint, state=state, cfg=self.cfg, actor=self.actor,
            tokenizer=self.tokenizer, extractor=self.extractor, experience=self.experience))
        return self.last_checkpoint

    def save_merged_actor(self, directory: Path) -> Path:
        """Export the actor as one plain transformers model, LoRA adapters merged in fp32
        (``crl eval`` and vLLM read it without peft)."""
        return save_merged_actor(self.actor, self.tokenizer, directory)

    # ================================================================== plumbing
    def _prepare_bank(self, checkpoint: Path | None) -> None:
        """The bank a run starts from: a resumed run's checkpoint's, else
        ``experience.initial_bank``'s entries, else none (a fresh run's folder holds no bank)."""
        source = checkpoint or self.cfg.experience.initial_bank
        if source:
            restore_bank(self.run_dir, source, self.cfg.experience.capacity)

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
        try:
            self.rollouts.close()
            if getattr(self, "lesson_replay", None) is not None:
                self.lesson_replay.close()
            if self.experience is not None:
                self.experience.close()
        finally:
            self.placement.close()
        self.metrics.close()
        self.run.close()
