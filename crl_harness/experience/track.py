"""The Experience Manager's background track, as its parts share it (docs/method.md, "The
Experience Manager and its asynchronous loop").

Holds:
- ``TrackState``: what the track has left to do, the extractor's queued jobs and the partitions
  awaiting re-indexing, under one condition: ``flush`` waits on both, and the indexer re-indexes
  at once when a flush waits and every job is applied.
- ``Counters``: the manager's named counters (``ExperienceManager.stats``), counted by its parts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping

__all__ = ["TrackState", "Counters"]


class TrackState:
    """Jobs pending and partitions dirty, under one condition; closed once, never reopened.

    Example:
        >>> track = TrackState()
        >>> track.job_queued(); track.job_done(); track.wait_idle(timeout=0)
        True
        >>> track.close(); track.job_queued()
        Traceback (most recent call last):
        RuntimeError: ExperienceManager is closed; no new jobs are accepted.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending = 0
        self._dirty: set[str] = set()
        self._indexing = False
        self._flushing = 0
        self.closed = False

    def job_queued(self) -> None:
        """Count a job about to be queued; refused once closed."""
        with self._cond:
            if self.closed:
                raise RuntimeError("ExperienceManager is closed; no new jobs are accepted.")
            self._pending += 1

    def job_done(self) -> None:
        """A queued job was applied (or dropped)."""
        with self._cond:
            self._pending -= 1
            self._cond.notify_all()

    def mark_dirty(self, env_ids: Iterable[str]) -> None:
        """``env_ids``' partitions changed: the indexer rebuilds them."""
        with self._cond:
            self._dirty |= set(env_ids)
            self._cond.notify_all()

    def next_due(self, interval_s: float, rebuilt_at: Mapping[str, float]) -> set[str] | None:
        """Block until some dirty partitions are due for a rebuild (``interval_s`` after their
        last, ``rebuilt_at``; at once while a flush waits on no job, or once closed) and take
        them; None once closed with nothing dirty. ``indexed`` ends the rebuild."""
        with self._cond:
            while True:
                if self.closed and not self._dirty:
                    return None
                now = time.monotonic()
                # A flush re-indexes once its jobs are all applied, not after each of them.
                flushing = self._flushing and not self._pending
                due = {env for env in self._dirty if flushing or self.closed
                       or now - rebuilt_at.get(env, -1e9) >= interval_s}
                if due:
                    self._dirty -= due
                    self._indexing = True
                    return due
                waits = [rebuilt_at[env] + interval_s - now for env in self._dirty]
                self._cond.wait(min(waits) if waits else None)

    def indexed(self) -> None:
        """The partitions ``next_due`` gave are rebuilt."""
        with self._cond:
            self._indexing = False
            self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no job is pending and no partition awaits re-indexing; False if
        ``timeout`` ran out. The indexer rebuilds at once while someone waits."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._pending or self._dirty or self._indexing:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
            finally:
                self._flushing -= 1
        return True

    def close(self) -> None:
        """Accept no more jobs; the indexer rebuilds what is dirty and stops."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def backlog(self) -> tuple[int, int]:
        """The jobs pending and the partitions awaiting (or in) a rebuild."""
        with self._cond:
            return self._pending, len(self._dirty) + int(self._indexing)


class Counters:
    """Named counters, thread-safe; a name not declared at construction is a bug (KeyError).

    Example:
        >>> counters = Counters(("asks",))
        >>> counters.add("asks"); counters.add("asks", 2); counters.snapshot()
        {'asks': 3}
    """

    def __init__(self, names: Iterable[str]) -> None:
        self._counts: dict[str, int] = dict.fromkeys(names, 0)
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        """Count ``n`` more of ``name``."""
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        """Every counter's value now."""
        with self._lock:
            return dict(self._counts)
