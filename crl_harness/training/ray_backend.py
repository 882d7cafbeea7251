"""``run.backend: ray``: rollout workers and the experience service as Ray actors, same semantics.

Holds ``RayPlacement`` (the ``Placement`` that puts the trainer's rollouts and its experience
service into Ray actors; the learners stay in the driver and push their new weights after each
update), ``RayRollouts``, ``RolloutWorker``, ``RemoteManager`` (the Experience Manager inside the
service actor, the rollout workers' ``ExperienceClient``), ``RemoteExperience`` (the service
actor, the trainer's ``ExperienceOwner``) and ``start_ray``. Both proxies are written method by
method: the actor's remote methods are ``ExperienceService``'s own.

Every actor asks for whole CPUs (``num_cpus=1``), never fractions; Ray runs with its own
temporary directory and without its dashboard.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crl_harness.config import LoRAConfig, TrainConfig
from crl_harness.experience import (
    AskAnswer,
    DistillationRequest,
    EpisodeOutcome,
    ExperienceOwner,
    GenerationReward,
)
from crl_harness.models.base import ModelBackend
from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory
from crl_harness.training.experience_service import ExperienceService
from crl_harness.training.learner import PolicyLearner, load_trainable_state
from crl_harness.training.placement import experience_options
from crl_wrappers.experience import ExperienceItem

__all__ = ["RayPlacement", "RayRollouts", "RolloutWorker", "RemoteManager", "RemoteExperience",
           "start_ray"]


def start_ray(num_cpus: int) -> str:
    """Start a private local Ray instance; returns its temporary directory."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="crl-ray-")
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir,
                 log_to_driver=False, configure_logging=False)
    return temp_dir


class RemoteManager:
    """The Experience Manager inside an experience service actor (``handle``) as the rollout
    workers call it: an ``ExperienceClient``, each call blocking on its answer."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def retrieve(self, env_id: str, query: str, k: int = 1) -> list[ExperienceItem]:
        return _ray_get(self.handle.retrieve.remote(env_id, query, k))

    def ask(self, env_id: str, query: str, k: int = 1) -> AskAnswer:
        return _ray_get(self.handle.ask.remote(env_id, query, k))


def _ray_get(ref: Any) -> Any:
    import ray

    return ray.get(ref)


class RolloutWorker:
    """A copy of the actor model and a rollout engine, in its own process."""

    def __init__(self, model: str, lora: LoRAConfig, rollout: RolloutConfig, service: Any, *,
                 torch_threads: int, dtype: str, kv_cache_tokens: int, seed: int) -> None:
        import torch

        from crl_harness.models import load_backend
        from crl_harness.training.learner import apply_lora

        torch.set_num_threads(max(torch_threads, 1))
        torch.manual_seed(seed)  # sampling draws from this process's global RNG
        self.backend = load_backend(model, dtype=dtype, kv_cache_tokens=kv_cache_tokens)
        self.lora = lora.enabled
        if self.lora:
            apply_lora(self.backend.model, lora)
        retriever = RemoteManager(service) if service is not None else None
        self.engine = RolloutEngine(self.backend, retriever=retriever, config=rollout)

    def run(self, specs: list[EpisodeSpec]) -> list[Trajectory]:
        return self.engine.run(specs)

    def load_weights(self, state: dict[str, Any]) -> None:
        if self.lora:
            load_trainable_state(self.backend.model, state, lora=True)
        else:
            self.backend.load_weights(state)

    def close(self) -> None:
        self.engine.close()


class RemoteExperience:
    """The experience service actor (``handle``) as the trainer holds it: an
    ``ExperienceOwner``, each call one blocking round trip (a step's credit and its
    distillation requests go in one call each)."""

    def __init__(self, handle: Any, lora: bool) -> None:
        self.handle = handle
        self.lora = lora
        self.client = RemoteManager(handle)
        self.weights_lock = contextlib.nullcontext()  # the learner's copy is not the generator's

    def flush(self, timeout: float | None = None) -> bool:
        return _ray_get(self.handle.flush.remote(timeout))

    def submit(self, requests: Sequence[DistillationRequest]) -> None:
        _ray_get(self.handle.submit.remote(list(requests)))

    def merge_pass(self) -> int:
        return _ray_get(self.handle.merge_pass.remote())

    def credit(self, outcomes: Sequence[EpisodeOutcome], relative: bool = False) -> None:
        _ray_get(self.handle.credit.remote(list(outcomes), relative))

    def generation_rewards(self, min_uses: int = 1) -> list[GenerationReward]:
        return _ray_get(self.handle.generation_rewards.remote(min_uses))

    def release_generations(self, generation_ids: Sequence[str]) -> int:
        return _ray_get(self.handle.release_generations.remote(list(generation_ids)))

    def stats(self) -> dict[str, Any]:
        return _ray_get(self.handle.stats.remote())

    def export_state(self, directory: str | os.PathLike) -> int:
        return _ray_get(self.handle.export_state.remote(str(directory)))

    def import_ledger(self, directory: str | os.PathLike) -> None:
        _ray_get(self.handle.import_ledger.remote(str(directory)))

    def load_extractor_weights(self, state: dict[str, Any]) -> None:
        _ray_get(self.handle.load_extractor_weights.remote(state, self.lora))

    def close(self) -> None:
        _ray_get(self.handle.close.remote())


class RayRollouts:
    """Rollout workers as Ray actors; ``run`` deals the specs out and keeps their order."""

    def __init__(self, workers: list[Any]) -> None:
        import ray

        self._ray = ray
        self.workers = workers

    def run(self, specs: list[EpisodeSpec]) -> list[Trajectory]:
        n = len(self.workers)
        results = self._ray.get([w.run.remote(specs[i::n]) for i, w in enumerate(self.workers)])
        ordered: list[Trajectory | None] = [None] * len(specs)
        for i, trajectories in enumerate(results):
            ordered[i::n] = trajectories
        return ordered  # type: ignore[return-value]

    def load_weights(self, state: dict[str, Any]) -> None:
        ref = self._ray.put(state)
        self._ray.get([w.load_weights.remote(ref) for w in self.workers])

    def close(self) -> None:
        self._ray.get([w.close.remote() for w in self.workers])


class RayPlacement:
    """The trainer's rollout workers (``run.rollout_workers``, each with its own copy of the
    actor) and its experience service (with its own copy of the extractor) as Ray actors, on a
    private Ray instance started here; the learners train in the driver, and ``push_weights``
    sends their new weights to the copies. ``close`` shuts Ray down."""

    def __init__(self, cfg: TrainConfig) -> None:
        import ray

        self._ray = ray
        self._ray_dir = start_ray(num_cpus=cfg.run.rollout_workers + 1)
        self._learners: dict[str, PolicyLearner] = {}
        self._rollouts: RayRollouts | None = None
        self._experience: RemoteExperience | None = None

    def sampling_backend(self, cfg: TrainConfig, role: str, learner: PolicyLearner,
                         learner_backend: ModelBackend) -> ModelBackend:
        """The learner's own backend (``rollout_engine: hf``, which ``run.backend: ray`` needs):
        the Ray actors generate with copies of its weights, pushed after each update."""
        self._learners[role] = learner
        return learner_backend

    def experience(self, cfg: TrainConfig, run_dir: Path, extractor_backend: ModelBackend,
                   extractor_spec: str, extractor: PolicyLearner | None) -> RemoteExperience:
        actor_cls = self._ray.remote(num_cpus=1, max_concurrency=16)(ExperienceService)
        handle = actor_cls.remote(str(run_dir), cfg.experience, extractor_spec,
                                  lora=cfg.extractor.lora, dtype=cfg.extractor.dtype,
                                  kv_cache_tokens=cfg.kv_cache_tokens("extractor"),
                                  **experience_options(cfg))
        self._experience = RemoteExperience(handle, cfg.extractor.lora.enabled)
        if extractor is not None:  # the driver's learner copy starts from the same weights
            self._experience.load_extractor_weights(extractor.trainable_state_dict())
        return self._experience

    def rollouts(self, cfg: TrainConfig, actor_backend: ModelBackend,
                 experience: ExperienceOwner | None) -> RayRollouts:
        """Workers that retrieve and ask through the service actor this placement started
        (``experience`` is its ``RemoteExperience``)."""
        # each worker steps its envs in one thread; the workers are the parallelism
        rollout = RolloutConfig.from_config(cfg, workers=1)
        worker_cls = self._ray.remote(num_cpus=1)(RolloutWorker)
        service = self._experience.handle \
            if experience is not None and self._experience is not None else None
        self._rollouts = RayRollouts([
            worker_cls.remote(cfg.actor.model, cfg.actor.lora, rollout, service,
                              torch_threads=cfg.run.torch_threads or 1, dtype=cfg.actor.dtype,
                              kv_cache_tokens=cfg.kv_cache_tokens("actor"),
                              seed=cfg.run.seed + 1 + i)
            for i in range(cfg.run.rollout_workers)])
        return self._rollouts

    def push_weights(self, actor_updated: bool, extractor_updated: bool) -> None:
        if actor_updated and self._rollouts is not None:
            self._rollouts.load_weights(self._learners["actor"].trainable_state_dict())
        if extractor_updated and self._experience is not None and "extractor" in self._learners:
            self._experience.load_extractor_weights(
                self._learners["extractor"].trainable_state_dict())

    def close(self) -> None:
        self._ray.shutdown()
        shutil.rmtree(self._ray_dir, ignore_errors=True)
