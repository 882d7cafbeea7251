"""The experience's two faces: what the rollouts call, and what the trainer that owns it calls.

Holds:
- ``ExperienceClient``: retrieve and ask. ``ExperienceManager`` implements it in one process,
  ``crl_harness.training.ray_backend.RemoteManager`` over Ray; its ``retrieve`` is the wrapper's
  ``Retriever`` (``crl_wrappers.experience``), which is all a wrapper needs.
- ``ExperienceOwner``: the trainer's side (flush, submit, merge pass, a step's credit in one call,
  the extractor's rewards and their release, stats, checkpoints, the weights lock, close).
  ``crl_harness.training.experience_service.ExperienceService`` implements it in one process,
  ``crl_harness.training.ray_backend.RemoteExperience`` over Ray.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from crl_harness.experience.ask import AskAnswer
from crl_harness.experience.credit import EpisodeOutcome, GenerationReward
from crl_harness.experience.distill import DistillationRequest
from crl_wrappers.experience import ExperienceItem, Retriever

__all__ = ["ExperienceClient", "ExperienceOwner"]


@runtime_checkable
class ExperienceClient(Retriever, Protocol):
    """What the rollouts call on the experience side, wherever the bank lives: ``retrieve``
    serves a reset (``ExperienceAugmentation``), ``ask`` an actor's query mid-episode
    (search-and-ask). Crediting is the owner's (``ExperienceOwner.credit``).

    Example:
        >>> from crl_harness.experience import ExperienceBank, ExperienceManager
        >>> bank = ExperienceBank(":memory:")
        >>> with ExperienceManager(bank) as manager:
        ...     isinstance(manager, ExperienceClient)
        True
        >>> bank.close()
    """

    def retrieve(self, env_id: str, query: str, k: int = 1) -> Sequence[ExperienceItem]:
        """Top-``k`` entries of ``env_id``'s partition for ``query``."""
        ...

    def ask(self, env_id: str, query: str, k: int = 1) -> AskAnswer:
        """The extractor's answer to ``query``, from the ``k`` entries retrieved for it."""
        ...


class ExperienceOwner(Protocol):
    """The experience side as the trainer holds it: the bank, the extractor's generation and
    the manager over them, each call one round trip wherever they run."""

    @property
    def client(self) -> ExperienceClient:
        """What the rollouts of the trainer's process retrieve and ask through."""
        ...

    @property
    def weights_lock(self) -> AbstractContextManager[Any]:
        """Held by the extractor's generation; an update of its weights takes it too."""
        ...

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is applied and indexed; False if ``timeout`` ran out."""
        ...

    def submit(self, requests: Sequence[DistillationRequest]) -> None:
        """Queue finished episodes for distillation (returns at once)."""
        ...

    def merge_pass(self) -> int:
        """Queue a merge pass over every partition; returns the number of chunks queued."""
        ...

    def credit(self, outcomes: Sequence[EpisodeOutcome], relative: bool = False) -> None:
        """Credit a step's finished episodes (``credit.credit_episodes``)."""
        ...

    def generation_rewards(self, min_uses: int = 1) -> list[GenerationReward]:
        """Extractor generations ready for training, with their rewards so far."""
        ...

    def release_generations(self, generation_ids: Sequence[str]) -> int:
        """Forget generations that were trained on; returns how many were awaiting training."""
        ...

    def stats(self) -> dict[str, Any]:
        """Counters of the manager and the bank."""
        ...

    def export_state(self, directory: str | os.PathLike) -> int:
        """Flush, then write the bank and the credit state into a checkpoint's ``directory``;
        returns the number of entries."""
        ...

    def import_ledger(self, directory: str | os.PathLike) -> None:
        """The credit state of a checkpoint (``export_state``'s), if it has any."""
        ...

    def close(self) -> None:
        """Stop the manager's threads and close the bank."""
        ...
