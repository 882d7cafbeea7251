"""What the Experience Manager knows of each entry beyond the bank, for credit (docs/method.md,
"Credit assignment for the extractor").

Holds ``LessonRecords``: the generation that wrote each retrieved entry (kept a while after the
entry is gone, so that a late outcome still credits its writer), the generations that endorsed
an entry by writing it again, and the wins and losses of its own level's episodes that used it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from typing import Any

from crl_harness.experience.entries import ExperienceEntry

__all__ = ["LessonRecords"]


class LessonRecords:
    """Writers, endorsers and use records of entries, thread-safe.

    ``remembered``: how many retrieved entries' writers are kept (oldest forgotten first).

    Example:
        >>> from crl_harness.experience.entries import ExperienceEntry
        >>> records = LessonRecords(remembered=8)
        >>> entry = ExperienceEntry("e1", "CRL/Sokoban-v0", "Boxes", "Avoid corners.", "g1", votes=2)
        >>> records.remember_retrieved([[entry]])
        >>> records.credited([("e1", entry)], won=True), records.record_of(entry)
        (['g1'], 3)
    """

    def __init__(self, remembered: int) -> None:
        self._remembered = remembered
        self._lock = threading.Lock()
        self._writer: OrderedDict[str, str | None] = OrderedDict()
        self._endorsers: dict[str, list[str]] = {}
        self._outcomes: dict[str, tuple[int, int]] = {}  # entry id -> wins, losses

    def remember_retrieved(self, results: Iterable[Sequence[ExperienceEntry]]) -> None:
        """Keep the writer of each entry just retrieved."""
        with self._lock:
            for chosen in results:
                for entry in chosen:
                    self._writer[entry.id] = entry.generation_id
                    self._writer.move_to_end(entry.id)
            while len(self._writer) > self._remembered:
                self._writer.popitem(last=False)

    def credited(self, used: Sequence[tuple[str, ExperienceEntry | None]],
                 won: bool | None = None) -> list[str | None]:
        """The generations an episode that used these (id, entry or None when gone) credits:
        each one's writer and endorsers; with ``won`` (its level's own episode), the use is
        recorded as a win or a loss of each live entry."""
        generations: list[str | None] = []
        with self._lock:
            for entry_id, entry in used:
                if entry_id in self._writer:
                    generations.append(self._writer[entry_id])
                else:
                    generations.append(entry.generation_id if entry else None)
                generations.extend(self._endorsers.get(entry_id, ()))
                if entry is not None and won is not None:
                    wins, losses = self._outcomes.get(entry_id, (0, 0))
                    self._outcomes[entry_id] = (wins + won, losses + (not won))
        return generations

    def record_of(self, entry: ExperienceEntry) -> int:
        """An entry's record: its votes (endorsements included) plus its wins minus its losses
        when an episode of its own level used it."""
        wins, losses = self._outcomes.get(entry.id, (0, 0))
        return entry.votes + wins - losses

    def endorse(self, pairs: Iterable[tuple[str, str | None]], live: Container[str]) -> None:
        """Each (entry, generation) pair: the generation wrote the ``live`` entry again."""
        with self._lock:
            for entry_id, generation_id in pairs:
                if entry_id in live and generation_id:
                    self._endorsers.setdefault(entry_id, []).append(generation_id)

    def forget(self, entry_ids: Iterable[str]) -> None:
        """Entries deleted or evicted: their endorsers and records go (their writers stay
        remembered for outcomes still to come)."""
        with self._lock:
            for entry_id in entry_ids:
                self._endorsers.pop(entry_id, None)
                self._outcomes.pop(entry_id, None)

    def export(self) -> dict[str, Any]:
        """The endorsers and the use record of every entry (a checkpoint's)."""
        with self._lock:
            return {"endorsers": {k: list(v) for k, v in self._endorsers.items()},
                    "outcomes": dict(self._outcomes)}

    def load(self, records: dict[str, Any]) -> None:
        """Put back ``export``'s (a resumed run's)."""
        with self._lock:
            self._endorsers = {str(k): list(v) for k, v in records.get("endorsers", {}).items()}
            self._outcomes = {str(k): (int(w), int(lost))
                              for k, (w, lost) in records.get("outcomes", {}).items()}
