"""Where a training run's parts run: the trainer is handed a ``Placement`` and builds its rollouts,
its experience service and what its learners sample with through it.

Holds ``Placement`` (what the trainer asks of one), ``Rollouts`` (what plays a step's episodes),
``LocalPlacement`` (everything in the
trainer's process, the default) and ``experience_options`` (the extractor's generation settings
of a run, which every placement gives its experience service). ``RayPlacement``
(``run.backend: ray``) is in ``ray_backend``; the command chooses
(``crl_harness.commands.train.make_trainer``), so the trainer imports no placement but the local
one, and nothing here imports the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from crl_harness.config import TrainConfig
from crl_harness.experience import ExperienceOwner
from crl_harness.models.base import ModelBackend
from crl_harness.models.engines import SyncedSampler, sampling_engine
from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory
from crl_harness.training.experience_service import ExperienceService
from crl_harness.training.learner import PolicyLearner

__all__ = ["Placement", "Rollouts", "LocalPlacement", "experience_options"]


def experience_options(cfg: TrainConfig) -> dict[str, Any]:
    """The ``ExperienceService`` settings of ``cfg`` besides its ``experience`` section: how the
    extractor generates, the run's seed, and the reward of a malformed answer."""
    x = cfg.extractor
    return dict(max_new_tokens=x.max_new_tokens, temperature=x.temperature, top_p=x.top_p,
                seed=cfg.run.seed, format_penalty=x.format_penalty,
                exact_key_envs=cfg.exact_key_envs())


class Rollouts(Protocol):
    """What plays a step's episodes, wherever it runs."""

    def run(self, specs: list[EpisodeSpec]) -> list[Trajectory]:
        """The trajectories of ``specs``, in their order."""
        ...

    def close(self) -> None:
        """Free the envs and workers."""
        ...


class Placement(Protocol):
    """Where the trainer's parts run. The trainer builds, in this order, what each learner
    samples with (``sampling_backend``), the experience service (``experience``, arms with
    experience only) and the rollouts (``rollouts``); after a step's updates ``push_weights``
    brings the new weights to whatever generates with a copy of them; ``close`` frees what the
    placement started."""

    def sampling_backend(self, cfg: TrainConfig, role: str, learner: PolicyLearner,
                         learner_backend: ModelBackend) -> ModelBackend:
        """The backend ``role`` (``actor``, ``extractor``) generates with in the trainer's
        process, given its learner and the backend whose model the learner trains."""
        ...

    def experience(self, cfg: TrainConfig, run_dir: Path, extractor_backend: ModelBackend,
                   extractor_spec: str, extractor: PolicyLearner | None) -> ExperienceOwner:
        """The experience service over ``run_dir``'s bank (already restored), generating with
        ``extractor_backend`` (or a copy of ``extractor_spec``'s model); ``extractor``: its
        learner, when the arm trains it."""
        ...

    def rollouts(self, cfg: TrainConfig, actor_backend: ModelBackend,
                 experience: ExperienceOwner | None) -> Rollouts:
        """What plays a step's episodes, retrieving and asking through ``experience``'s
        client (arms with experience)."""
        ...

    def push_weights(self, actor_updated: bool, extractor_updated: bool) -> None:
        """Bring the learners' new weights to the copies that generate with them."""
        ...

    def close(self) -> None:
        """Free what the placement started (engines, processes)."""
        ...


class LocalPlacement:
    """Everything in the trainer's process: the rollout engine and the experience service run
    here; a learner samples with its own model (``rollout_engine: hf``, trained in place, so
    nothing is pushed) or with a copy its engine's row starts and syncs after each update
    (``rollout_engine: vllm``, ``engines[role]``; ``models.engines.SAMPLING_ENGINES``)."""

    def __init__(self) -> None:
        self.engines: dict[str, SyncedSampler] = {}
        self._experience: ExperienceService | None = None

    def sampling_backend(self, cfg: TrainConfig, role: str, learner: PolicyLearner,
                         learner_backend: ModelBackend) -> ModelBackend:
        engine = sampling_engine(getattr(cfg, role).rollout_engine)
        if engine.synced is None:
            return learner_backend
        copy = engine.synced(learner, learner_backend, kv_cache_tokens=cfg.kv_cache_tokens(role),
                             seed=cfg.run.seed)
        self.engines[role] = copy
        return copy.backend

    def experience(self, cfg: TrainConfig, run_dir: Path, extractor_backend: ModelBackend,
                   extractor_spec: str, extractor: PolicyLearner | None) -> ExperienceService:
        self._experience = ExperienceService(run_dir, cfg.experience, extractor_backend,
                                             **experience_options(cfg))
        return self._experience

    def rollouts(self, cfg: TrainConfig, actor_backend: ModelBackend,
                 experience: ExperienceOwner | None) -> RolloutEngine:
        return RolloutEngine(actor_backend,
                             retriever=experience.client if experience is not None else None,
                             config=RolloutConfig.from_config(cfg))

    def push_weights(self, actor_updated: bool, extractor_updated: bool) -> None:
        if actor_updated and "actor" in self.engines:
            self.engines["actor"].sync()
        if extractor_updated and "extractor" in self.engines and self._experience is not None:
            with self._experience.weights_lock:  # no distillation sees half an update
                self.engines["extractor"].sync()

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()
