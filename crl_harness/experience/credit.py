"""Credit for the extractor: which extractor generations wrote experience that was used, and how
the episodes that used it ended.

Holds ``GenerationReward`` (what the trainer drains) and ``CreditLedger``. A generation's reward is
the mean, over the episodes that retrieved entries it wrote, of the episode's score, with a score
of 0 counted as -1 (PAPER.md, "Extractor: CISPO, credited by use").
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["GenerationReward", "CreditLedger", "episode_credit"]


def episode_credit(score: float) -> float:
    """The credit one episode gives: its score, or -1 when the score is 0 (a failure)."""
    return float(score) if score > 0 else -1.0


@dataclass
class GenerationReward:
    """One extractor generation with its reward, ready for the extractor's update."""

    generation_id: str
    prompt: str
    output: Any
    """What the extractor returned (a model backend's ``Generation`` keeps token ids/logprobs)."""
    reward: float
    n_uses: int
    kind: Literal["distill", "merge"]


@dataclass
class _Record:
    prompt: str
    output: Any
    kind: Literal["distill", "merge"]
    total: float = 0.0
    n_uses: int = 0
    fixed_reward: float | None = None


class CreditLedger:
    """Generations waiting for credit, and the credit they received. Thread-safe.

    ``max_generations`` bounds memory: past it, the oldest generation that was never used is
    forgotten (its entries were probably evicted or merged away).

    Example:
        >>> ledger = CreditLedger()
        >>> ledger.register("g1", "prompt", "output", "distill")
        >>> ledger.credit(["g1"], score=1.0), ledger.credit(["g1"], score=0.0)
        (1, 1)
        >>> [(r.generation_id, r.reward, r.n_uses) for r in ledger.drain()]
        [('g1', 0.0, 2)]
    """

    def __init__(self, max_generations: int = 10_000) -> None:
        self.max_generations = max_generations
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()
        self.forgotten = 0

    def register(self, generation_id: str, prompt: str, output: Any,
                 kind: Literal["distill", "merge"], fixed_reward: float | None = None) -> None:
        """Remember a generation; ``fixed_reward`` makes it drainable at once (format failures)."""
        with self._lock:
            self._records[generation_id] = _Record(prompt, output, kind, fixed_reward=fixed_reward)
            while len(self._records) > self.max_generations:
                victim = next((g for g, r in self._records.items()
                               if r.n_uses == 0 and r.fixed_reward is None), None)
                if victim is None:
                    break
                del self._records[victim]
                self.forgotten += 1

    def credit(self, generation_ids: Iterable[str | None], score: float) -> int:
        """Credit each distinct known generation with one episode; returns how many."""
        value = episode_credit(score)
        credited = 0
        with self._lock:
            for generation_id in set(generation_ids):
                record = self._records.get(generation_id) if generation_id else None
                if record is not None and record.fixed_reward is None:
                    record.total += value
                    record.n_uses += 1
                    credited += 1
        return credited

    def drain(self, min_uses: int = 1) -> list[GenerationReward]:
        """Take every generation used at least ``min_uses`` times (and fixed-reward ones)."""
        out: list[GenerationReward] = []
        with self._lock:
            for generation_id, record in list(self._records.items()):
                if record.fixed_reward is not None:
                    reward = record.fixed_reward
                elif record.n_uses >= min_uses:
                    reward = record.total / record.n_uses
                else:
                    continue
                del self._records[generation_id]
                out.append(GenerationReward(generation_id, record.prompt, record.output, reward,
                                            record.n_uses, record.kind))
        return out

    def __len__(self) -> int:
        return len(self._records)
