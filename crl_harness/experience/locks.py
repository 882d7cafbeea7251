"""The lock between the Experience Manager's retrievals and its bank writes.

Holds ``ReadWriteLock``: shared readers, exclusive writers, phase-fair (a waiting writer blocks new
readers, so writers are not starved; readers waiting at a write release go next).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ReadWriteLock"]


class ReadWriteLock:
    """Many readers or one writer, phase-fair: neither side starves.

    A waiting writer keeps new readers out; when a writer releases, the readers that were
    waiting enter before the next writer.

    Example:
        >>> lock = ReadWriteLock()
        >>> with lock.read():
        ...     with lock.read():  # readers share
        ...         pass
        >>> with lock.write():
        ...     pass
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0
        self._waiting_readers = 0
        self._releases = 0  # write releases so far
        self._admitting = 0  # readers let in by the last write release, not yet entered

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            if self._writer or self._waiting_writers:
                self._waiting_readers += 1
                seen = self._releases
                while self._writer or (self._waiting_writers and self._releases == seen):
                    self._cond.wait()
                self._waiting_readers -= 1
                if self._releases != seen and self._admitting:
                    self._admitting -= 1
                    if not self._admitting:
                        self._cond.notify_all()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            while self._writer or self._readers or self._admitting:
                self._cond.wait()
            self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._releases += 1
                self._admitting = self._waiting_readers
                self._cond.notify_all()
