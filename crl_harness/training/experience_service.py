"""The experience side of a training run, built: the bank, the extractor's batched generation and
the Experience Manager over them.

Holds ``ExperienceService``, the trainer's ``ExperienceOwner`` in one process; its ``client``
(the manager) is what the rollouts call. The same class runs as a Ray actor
(``crl_harness.training.ray_backend``): every public method takes and returns plain, picklable
data.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crl_harness.config import ExperienceConfig
from crl_harness.experience import (
    AskAnswer,
    DistillationRequest,
    EpisodeOutcome,
    ExperienceBank,
    ExperienceClient,
    ExperienceEntry,
    ExperienceManager,
    GenerationReward,
    ManagerConfig,
    credit_episodes,
)
from crl_harness.experience.checkpoint import BANK_FILE, export_experience, import_credit
from crl_harness.models.base import KV_CACHE_TOKENS, ModelBackend
from crl_harness.models.batched import BatchedGenerator

__all__ = ["ExperienceService"]


class ExperienceService:
    """The bank (``run_dir/bank.sqlite``), the extractor's generator and the ``manager`` over
    them: the trainer's ``ExperienceOwner``; ``client`` (the manager) serves the rollouts.

    ``extractor`` is a backend object (in one process: the very model the extractor learner
    trains) or a backend spec (a Ray actor builds its own copy, in ``dtype`` with
    ``kv_cache_tokens`` of KV cache, and receives new weights through ``load_extractor_weights``).
    ``format_penalty``: the extractor's opt-in reward of a malformed answer (None: not trained,
    see ``ManagerConfig``).
    """

    def __init__(self, run_dir: str | os.PathLike, config: ExperienceConfig,
                 extractor: ModelBackend | str, *, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int = 0, lora: Any = None, dtype: str = "auto",
                 kv_cache_tokens: int = KV_CACHE_TOKENS,
                 format_penalty: float | None = None,
                 exact_key_envs: Sequence[str] = ()) -> None:
        if isinstance(extractor, str):
            from crl_harness.models import load_backend

            extractor = load_backend(extractor, dtype=dtype, kv_cache_tokens=kv_cache_tokens)
            if lora is not None and lora.enabled:
                from crl_harness.training.learner import apply_lora

                apply_lora(extractor.model, lora)
        self.backend = extractor
        self.run_dir = Path(run_dir)
        self.bank = ExperienceBank(self.run_dir / BANK_FILE, capacity=config.capacity)
        self.generator = BatchedGenerator(extractor, max_new_tokens=max_new_tokens,
                                          temperature=temperature, top_p=top_p,
                                          max_batch=config.max_concurrent_extractions)
        self.manager = ExperienceManager(self.bank, self.generator, ManagerConfig.from_config(
            config, exact_key_envs, format_penalty=format_penalty, seed=seed))

    # ------------------------------------------------------------ weights
    @property
    def weights_lock(self) -> threading.Lock:
        """Held by the extractor's generation; an update of its weights takes it too."""
        return self.generator.weights_lock

    def load_extractor_weights(self, state: dict[str, Any], lora: bool = False) -> None:
        """New extractor weights for a copy living apart from the learner (a Ray actor)."""
        with self.generator.weights_lock:
            if lora:
                from crl_harness.training.learner import load_trainable_state

                load_trainable_state(self.backend.model, state, lora=True)
            else:
                self.backend.load_weights(state)

    @property
    def client(self) -> ExperienceClient:
        return self.manager

    # ------------------------------------------------------------ the trainer's step
    def flush(self, timeout: float | None = None) -> bool:
        return self.manager.flush(timeout)

    def submit(self, requests: Sequence[DistillationRequest]) -> None:
        for request in requests:
            self.manager.submit(request)

    def merge_pass(self) -> int:
        return self.manager.merge_pass()

    def credit(self, outcomes: Sequence[EpisodeOutcome], relative: bool = False) -> None:
        credit_episodes(self.manager, outcomes, relative)

    def generation_rewards(self, min_uses: int = 1) -> list[GenerationReward]:
        return self.manager.generation_rewards(min_uses)

    def release_generations(self, generation_ids: Sequence[str]) -> int:
        return self.manager.release_generations(generation_ids)

    def stats(self) -> dict[str, Any]:
        return self.manager.stats()

    # ------------------------------------------------------------ the rollouts' (Ray workers)
    def retrieve(self, env_id: str, query: str, k: int = 1) -> list[ExperienceEntry]:
        return self.manager.retrieve(env_id, query, k)

    def ask(self, env_id: str, query: str, k: int = 1) -> AskAnswer:
        return self.manager.ask(env_id, query, k)

    # ------------------------------------------------------------ checkpoints
    def export_state(self, directory: str | os.PathLike) -> int:
        return export_experience(self.manager, directory)

    def import_ledger(self, directory: str | os.PathLike) -> None:
        import_credit(self.manager, directory)

    def close(self) -> None:
        self.manager.close()
        self.generator.close()
        self.bank.close()
