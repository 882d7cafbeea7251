"""``run.backend: ray``: rollout workers and the experience service as Ray actors, same semantics.

Holds ``RayPlacement`` (the ``Placement`` that puts the trainer's rollouts and its experience
service into Ray actors; the learners stay in the driver and push their new weights after each
update), ``RayRollouts``, ``RolloutWorker``, ``RemoteManager`` (the Experience Manager inside the
service actor, an ``ExperienceClient`` for the rollout workers and the trainer) and ``start_ray``.

Every actor asks for whole CPUs (``num_cpus=1``), never fractions; Ray runs with its own
temporary directory and without its dashboard.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crl_harness.config import LoRAConfig, TrainConfig
from crl_harness.experience import AskAnswer
from crl_harness.models.base import ModelBackend
from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory
from crl_harness.training.experience_service import ExperienceService
from crl_harness.training.learner import PolicyLearner
from crl_harness.training.placement import experience_options
from crl_wrappers.experience import ExperienceItem

__all__ = ["RayPlacement", "RayRollouts", "RolloutWorker", "RemoteManager", "start_ray"]


def start_ray(num_cpus: int) -> str:
    """Start a private local Ray instance; returns its temporary directory."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="crl-ray-")
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=temp_dir,
                 log_to_driver=False, configure_logging=False)
    return temp_dir


class _ServiceActor(ExperienceService):
    """``ExperienceService`` as a Ray actor: a caller outside reaches the manager through
    ``manager_call`` (a Ray actor's remote methods are its class's own)."""

    def manager_call(self, method: str, *args: Any) -> Any:
        return getattr(self.manager, method)(*args)


class RemoteManager:
    """The manager of an experience service actor (``handle``), each call blocking on its
    answer: an ``ExperienceClient`` (rollout workers retrieve, ask and report through it) whose
    other methods (``flush``, ``submit``, ``stats``, ...) reach the manager's the same way."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def retrieve(self, env_id: str, query: str, k: int = 1) -> list[ExperienceItem]:
        return self._call("retrieve", env_id, query, k)

    def ask(self, env_id: str, query: str, k: int = 1) -> AskAnswer:
        return self._call("ask", env_id, query, k)

    def report_outcome(self, entry_ids: Sequence[str], score: float,
                       critic: float | None = None, baseline: float | None = None,
                       env_id: str = "", query: str = "") -> None:
        self._call("report_outcome", list(entry_ids), score, critic, baseline, env_id, query)

    def report_ask_outcome(self, generation_ids: Sequence[str], score: float) -> None:
        self._call("report_ask_outcome", list(generation_ids), score)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # no remote lookup for Python's own probes (copy, pickle)
            raise AttributeError(name)
        return functools.partial(self._call, name)

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(self.handle.manager_call.remote(method, *args))


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
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.backend.model, state)
        else:
            self.backend.load_weights(state)

    def close(self) -> None:
        self.engine.close()


class _RemoteExperience:
    """The experience service actor as the trainer holds it: its ``manager`` (``RemoteManager``)
    and its own methods (checkpoints, weights), each call blocking."""

    def __init__(self, handle: Any, lora: bool) -> None:
        self.handle = handle
        self.lora = lora
        self.manager = RemoteManager(handle)
        self.weights_lock = contextlib.nullcontext()  # the learner's copy is not the generator's

    def __getattr__(self, name: str) -> Any:
        import ray

        method = getattr(self.handle, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))

    def load_extractor_weights(self, state: dict[str, Any]) -> None:
        import ray

        ray.get(self.handle.load_extractor_weights.remote(state, self.lora))


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
        self._experience: _RemoteExperience | None = None

    def sampling_backend(self, cfg: TrainConfig, role: str, learner: PolicyLearner,
                         learner_backend: ModelBackend) -> ModelBackend:
        """The learner's own backend (``rollout_engine: hf``, which ``run.backend: ray`` needs):
        the Ray actors generate with copies of its weights, pushed after each update."""
        self._learners[role] = learner
        return learner_backend

    def experience(self, cfg: TrainConfig, run_dir: Path, extractor_backend: ModelBackend,
                   extractor_spec: str, extractor: PolicyLearner | None) -> _RemoteExperience:
        actor_cls = self._ray.remote(num_cpus=1, max_concurrency=16)(_ServiceActor)
        handle = actor_cls.remote(str(run_dir), cfg.experience, extractor_spec,
                                  lora=cfg.extractor.lora, dtype=cfg.extractor.dtype,
                                  kv_cache_tokens=cfg.kv_cache_tokens("extractor"),
                                  **experience_options(cfg))
        self._experience = _RemoteExperience(handle, cfg.extractor.lora.enabled)
        if extractor is not None:  # the driver's learner copy starts from the same weights
            self._experience.load_extractor_weights(extractor.trainable_state_dict())
        return self._experience

    def rollouts(self, cfg: TrainConfig, actor_backend: ModelBackend,
                 experience: Any) -> RayRollouts:
        # each worker steps its envs in one thread; the workers are the parallelism
        rollout = RolloutConfig.from_config(cfg, workers=1)
        worker_cls = self._ray.remote(num_cpus=1)(RolloutWorker)
        service = experience.handle if experience is not None else None
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
