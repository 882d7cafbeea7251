"""The experience as its users call it: the rollout engine, the experience wrapper, the trainer.

Holds:
- ``ExperienceClient``: retrieve, ask, report outcomes. ``ExperienceManager`` implements it in
  one process, ``crl_harness.training.ray_backend.RemoteManager`` over Ray; its ``retrieve`` is
  the wrapper's ``Retriever`` (``crl_wrappers.experience``), which is all a wrapper needs.
- ``RetrieveOnly``: a retriever's ``retrieve`` alone, for the wrappers that must not report
  outcomes: the rollout engine's (the trainer credits a step's episodes at once,
  ``credit.credit_episodes``, knowing their groups, gate verdicts and asks) and evaluation's
  (which leaves credit alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from crl_harness.experience.ask import AskAnswer
from crl_wrappers.experience import ExperienceItem, Retriever

__all__ = ["ExperienceClient", "RetrieveOnly"]


@runtime_checkable
class ExperienceClient(Retriever, Protocol):
    """What the harness calls on the experience side, wherever the bank lives.

    ``retrieve`` serves a reset (``ExperienceAugmentation``), ``ask`` an actor's query
    mid-episode (search-and-ask); ``report_outcome`` credits the writers of the entries a
    finished episode was shown (``credit.entry_credit``), ``report_ask_outcome`` the generations
    that answered its asks.

    Example:
        >>> from crl_harness.experience import ExperienceBank, ExperienceManager
        >>> bank = ExperienceBank(":memory:")
        >>> with ExperienceManager(bank) as manager:
        ...     view = RetrieveOnly(manager)
        ...     isinstance(manager, ExperienceClient), isinstance(view, ExperienceClient)
        (True, False)
        >>> bank.close()
    """

    def retrieve(self, env_id: str, query: str, k: int = 1) -> Sequence[ExperienceItem]:
        """Top-``k`` entries of ``env_id``'s partition for ``query``."""
        ...

    def ask(self, env_id: str, query: str, k: int = 1) -> AskAnswer:
        """The extractor's answer to ``query``, from the ``k`` entries retrieved for it."""
        ...

    def report_outcome(self, entry_ids: Sequence[str], score: float,
                       critic: float | None = None, baseline: float | None = None,
                       env_id: str = "", query: str = "") -> None:
        """An episode of ``env_id`` that retrieved with ``query`` and was shown ``entry_ids``
        ended with ``score`` (``critic``: the gate's score of them; ``baseline``: its group's
        free mean, for relative credit); an entry of another level's key credits nobody."""
        ...

    def report_ask_outcome(self, generation_ids: Sequence[str], score: float) -> None:
        """The episode whose asks ``generation_ids`` answered ended with ``score``."""
        ...


class RetrieveOnly:
    """``retriever``'s ``retrieve`` and nothing else: an ``ExperienceAugmentation`` over it
    reports no outcome, whatever ``retriever`` could.

    Example:
        >>> class Tips:
        ...     def retrieve(self, env_id, query, k):
        ...         return ["tip"][:k]
        ...     def report_outcome(self, entry_ids, score):
        ...         raise AssertionError("not through a RetrieveOnly")
        >>> view = RetrieveOnly(Tips())
        >>> view.retrieve("CRL/Sokoban-v0", "push", 1), hasattr(view, "report_outcome")
        (['tip'], False)
    """

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever

    def retrieve(self, env_id: str, query: str, k: int = 1) -> Sequence[ExperienceItem]:
        return self.retriever.retrieve(env_id, query, k)
