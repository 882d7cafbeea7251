"""The experience bank: a persistent, crash-safe store of distilled experience entries.

Holds ``ExperienceBank``: SQLite in WAL mode (an acknowledged write survives ``kill -9``), with an
in-memory mirror for fast reads, first-in-first-out eviction at a ``capacity`` stored with the
bank, one writing process at a time (others may open it ``read_only``) and JSONL export/import.

The records and changes it applies (``ExperienceEntry``, ``AddEntry``, ``DeleteEntries``,
``VoteEntry``, ``ApplyResult``, ``clean_text``) live in ``entries``; the file's layout, its
checks, its writer lock and ``BankError`` in ``bank_file``; its write transactions, tables and
first read in ``bank_sqlite``; ``DEFAULT_CAPACITY`` and the capacity rules in ``bank_capacity``;
the JSONL format in ``bank_jsonl``. The public names are imported here too, where they have
always been importable from.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from crl_harness.experience.bank_capacity import (
    DEFAULT_CAPACITY,
    resolve_capacity,
    store_capacity,
    stored_capacity,
)
from crl_harness.experience.bank_file import (
    _COLUMNS,
    _SCHEMA,
    BankError,
    _bank_error,
    _check_is_bank,
    _read_only_uri,
    _row,
    writer_lock,
)
from crl_harness.experience.bank_jsonl import read_jsonl, write_jsonl
from crl_harness.experience.bank_sqlite import create_tables, read_entries, transaction
from crl_harness.experience.entries import (
    AddEntry,
    ApplyResult,
    BankChange,
    DeleteEntries,
    ExperienceEntry,
    VoteEntry,
    clean_text,
)

__all__ = [
    "BankError",
    "DEFAULT_CAPACITY",
    "ExperienceEntry",
    "AddEntry",
    "DeleteEntries",
    "VoteEntry",
    "BankChange",
    "ApplyResult",
    "ExperienceBank",
    "clean_text",
]

_BUSY_TIMEOUT_S = 30.0  # a reader's checkpoint may hold the file briefly; wait, don't fail


class ExperienceBank:
    """Experience entries partitioned by env, persisted in SQLite (WAL) and mirrored in memory.

    Every write is one transaction; it returns only after SQLite committed it, so an
    acknowledged write survives a killed process (``synchronous="FULL"`` also survives power
    loss, at one fsync per commit). Reads come from the in-memory mirror. Retrieval counts are
    kept in memory and written by ``sync_retrieval_stats`` (the manager calls it on flush and
    close): losing a few counts in a crash costs nothing that was acknowledged.

    The capacity is stored in the bank: ``capacity=None`` reopens at the stored one (a bank from
    before it was stored: 20,000, or its size when larger), a larger one is kept from then on,
    and a smaller one raises ``BankError`` unless ``evict=True`` asks for the oldest entries to
    go. One process writes at a time (the mirror is that process's; a lock file beside the bank,
    released when the process dies, refuses a second writer); any number may open it with
    ``read_only=True``, which sees the entries as they were at opening. A file that is not a
    bank raises ``BankError`` and is left untouched. Text is stored as valid UTF-8 (lone
    surrogates from a model's output become U+FFFD).

    Writes are serialised by an internal lock; ``ExperienceManager`` adds a read-write lock so
    that a retrieval never sees half of a multi-change transaction.

    Example:
        >>> bank = ExperienceBank(":memory:", capacity=2)
        >>> a = bank.add("CRL/Sokoban-v0", "Corners", "Never push a box into a corner.")
        >>> b = bank.add("CRL/Sokoban-v0", "Walls", "A box on a wall stays on it.")
        >>> c = bank.add("CRL/Sokoban-v0", "Plan", "Count moves before pushing.")
        >>> len(bank), bank.get(a.id) is None, bank.evictions
        (2, True, 1)
        >>> bank.close()
    """

    SYNCHRONOUS = ("NORMAL", "FULL")

    def __init__(self, path: str | os.PathLike, capacity: int | None = None,
                 synchronous: str = "NORMAL", *, evict: bool = False,
                 read_only: bool = False) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}.")
        if synchronous not in self.SYNCHRONOUS:
            raise ValueError(f"synchronous={synchronous!r} is not one of {self.SYNCHRONOUS}.")
        self.path = str(path)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._lock_file = None
        self._db: sqlite3.Connection | None = None
        self._entries: dict[str, ExperienceEntry] = {}  # insertion (= seq) order: FIFO
        self._partitions: dict[str, dict[str, None]] = {}
        self._stats_dirty: set[str] = set()
        self.evictions = 0
        try:
            self._open(synchronous)
            stored = stored_capacity(self._db)
            for entry in read_entries(self._db, self.path):
                self._mirror_add(entry)
            self.capacity = resolve_capacity(capacity, stored, len(self._entries), self.path,
                                             evict=evict, read_only=read_only)
            if not read_only:
                if self.capacity != stored:
                    store_capacity(self._db, self.path, self.capacity)
                self._evict_over_capacity_now()
        except BaseException:
            self._release()
            raise

    # ----------------------------------------------------------------- opening
    def _open(self, synchronous: str) -> None:
        """Connect, after making sure the file is a bank (or new) without writing to it."""
        if self.path == ":memory:":
            if self.read_only:
                raise BankError("An in-memory bank cannot be opened read-only.")
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.executescript(_SCHEMA)
            return
        path = Path(self.path)
        if path.is_dir():
            raise BankError(f"{path} is a directory, not an experience bank file.")
        if self.read_only or path.exists():
            _check_is_bank(path, must_exist=self.read_only)
        if self.read_only:
            self._db = sqlite3.connect(_read_only_uri(path), uri=True, check_same_thread=False,
                                       isolation_level=None, timeout=_BUSY_TIMEOUT_S)
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_file = writer_lock(path)
            # isolation_level=None: autocommit; every write opens its own BEGIN IMMEDIATE.
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                       timeout=_BUSY_TIMEOUT_S)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
        except (OSError, sqlite3.DatabaseError) as err:
            raise _bank_error(path, err) from err
        create_tables(self._db, self.path)

    def _release(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock_file is not None:
            self._lock_file.close()  # closing the descriptor releases the flock
            self._lock_file = None

    # ----------------------------------------------------------------- reads
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._entries

    def get(self, entry_id: str) -> ExperienceEntry | None:
        """The live entry with this id, or ``None``."""
        return self._entries.get(entry_id)

    def entries(self, env_id: str | None = None) -> list[ExperienceEntry]:
        """Live entries, oldest first (of one partition when ``env_id`` is given)."""
        with self._lock:
            if env_id is None:
                return list(self._entries.values())
            return [self._entries[i] for i in self._partitions.get(env_id, ())]

    def env_ids(self) -> list[str]:
        """The partitions that hold at least one entry."""
        with self._lock:
            return [env for env, ids in self._partitions.items() if ids]

    def count(self, env_id: str) -> int:
        return len(self._partitions.get(env_id, ()))

    # ----------------------------------------------------------------- writes
    def add(self, env_id: str, title: str, content: str, *, generation_id: str | None = None,
            step: int = 0) -> ExperienceEntry:
        """Add one entry; returns it (with its new id)."""
        return self.apply([AddEntry(env_id, title, content, generation_id, step)]).added[0]

    def update(self, ids: Sequence[str], env_id: str, title: str, content: str, *,
               generation_id: str | None = None, step: int = 0) -> ExperienceEntry:
        """The paper's refine: delete the referenced entries and add the merged one."""
        changes: list[BankChange] = [DeleteEntries(tuple(ids)),
                                     AddEntry(env_id, title, content, generation_id, step)]
        return self.apply(changes).added[0]

    def delete(self, ids: Iterable[str]) -> int:
        """Delete entries; returns how many existed."""
        return len(self.apply([DeleteEntries(tuple(ids))]).deleted)

    def vote(self, entry_id: str, delta: int) -> bool:
        """Up (+1) or down (-1) vote; returns True when the entry was deleted by it."""
        return entry_id in self.apply([VoteEntry(entry_id, delta)]).deleted

    def apply(self, changes: Sequence[BankChange]) -> ApplyResult:
        """Run ``changes`` in one transaction; the mirror changes only after the commit."""
        self._check_writable()
        result = ApplyResult()
        now = time.time()
        with self._lock:
            gone: set[str] = set()
            added: list[ExperienceEntry] = []
            votes: dict[str, int] = {}
            cur = self._db.cursor()
            with transaction(self._db, self.path):
                for change in changes:
                    if isinstance(change, AddEntry):
                        entry = ExperienceEntry(
                            id=uuid.uuid4().hex[:16], env_id=clean_text(change.env_id),
                            title=clean_text(change.title), content=clean_text(change.content),
                            generation_id=None if change.generation_id is None
                            else clean_text(change.generation_id),
                            created_step=int(change.step), created_at=now)
                        cur.execute(f"INSERT INTO entries ({', '.join(_COLUMNS)}) VALUES "
                                    f"({', '.join('?' * len(_COLUMNS))})", _row(entry))
                        added.append(entry)
                    elif isinstance(change, DeleteEntries):
                        for entry_id in change.ids:
                            if self._live(entry_id, gone, added):
                                cur.execute("DELETE FROM entries WHERE id = ?", (entry_id,))
                                gone.add(entry_id)
                                result.deleted.append(entry_id)
                            else:
                                result.missing.append(entry_id)
                    elif isinstance(change, VoteEntry):
                        if not self._live(change.id, gone, added):
                            result.missing.append(change.id)
                            continue
                        current = votes.get(change.id, self._votes_of(change.id))
                        votes[change.id] = current + int(change.delta)
                        if votes[change.id] < 0:
                            cur.execute("DELETE FROM entries WHERE id = ?", (change.id,))
                            gone.add(change.id)
                            result.deleted.append(change.id)
                        else:
                            cur.execute("UPDATE entries SET votes = ? WHERE id = ?",
                                        (votes[change.id], change.id))
                    else:
                        raise TypeError(f"Not a bank change: {change!r}")
                live_after = len(self._entries) + len(added) - len(gone)
                overflow = max(0, live_after - self.capacity)
                if overflow:
                    result.evicted = self._oldest_live(overflow, gone, added)
                    cur.executemany("DELETE FROM entries WHERE id = ?",
                                    [(i,) for i in result.evicted])
                    gone.update(result.evicted)
            # Committed: now the mirror follows.
            for entry in added:
                self._mirror_add(entry)
            for entry_id, value in votes.items():
                if entry_id in self._entries and entry_id not in gone:
                    self._entries[entry_id] = replace(self._entries[entry_id], votes=value)
            result.envs = {self._entries[i].env_id for i in gone if i in self._entries}
            result.envs.update(entry.env_id for entry in added)
            for entry_id in gone:
                self._mirror_remove(entry_id)
            result.added = added
            self.evictions += len(result.evicted)
        return result

    def record_retrievals(self, ids: Iterable[str], when: float | None = None) -> None:
        """Count one retrieval of each entry (kept in memory until ``sync_retrieval_stats``)."""
        when = time.time() if when is None else when
        with self._lock:
            for entry_id in ids:
                entry = self._entries.get(entry_id)
                if entry is not None:
                    self._entries[entry_id] = replace(
                        entry, retrieval_count=entry.retrieval_count + 1, last_retrieved_at=when)
                    self._stats_dirty.add(entry_id)

    def sync_retrieval_stats(self) -> int:
        """Write the retrieval counts changed since the last sync; returns how many (a read-only
        bank keeps them in memory: they are its own view, not the writer's)."""
        with self._lock:
            if self.read_only:
                self._stats_dirty.clear()
                return 0
            rows = [(self._entries[i].retrieval_count, self._entries[i].last_retrieved_at, i)
                    for i in self._stats_dirty if i in self._entries]
            self._stats_dirty.clear()
            if rows:
                with transaction(self._db, self.path):
                    self._db.executemany("UPDATE entries SET retrieval_count = ?, "
                                         "last_retrieved_at = ? WHERE id = ?", rows)
        return len(rows)

    # ----------------------------------------------------------------- JSONL
    def export_jsonl(self, path: str | os.PathLike) -> int:
        """Write every live entry as one JSON object a line; returns the count."""
        return write_jsonl(path, self.entries())

    def import_jsonl(self, path: str | os.PathLike, *, evict: bool = True) -> int:
        """Add the entries of a JSONL export (ids already present are skipped); returns added.

        Raises ``ValueError`` naming the line of a malformed record; nothing is added then.
        Entries beyond the capacity evict the oldest, as adds do; with ``evict=False`` that is a
        ``BankError`` instead (restoring a checkpoint must not drop what it saved).
        """
        self._check_writable()
        records = read_jsonl(path)
        with self._lock:
            fresh = list({e.id: e for e in records if e.id not in self._entries}.values())
            if not evict and len(self._entries) + len(fresh) > self.capacity:
                raise BankError(
                    f"{path} holds {len(fresh)} new entries; with the {len(self._entries)} in "
                    f"{self.path} that is more than its capacity {self.capacity}. Raise the "
                    "capacity (experience.capacity) to keep them all.")
            with transaction(self._db, self.path):
                self._db.executemany(
                    f"INSERT OR IGNORE INTO entries ({', '.join(_COLUMNS)}) VALUES "
                    f"({', '.join('?' * len(_COLUMNS))})", [_row(e) for e in fresh])
            for entry in fresh:
                self._mirror_add(entry)
        if len(self._entries) > self.capacity:
            with self._lock:
                self._evict_over_capacity_now()
        return len(fresh)

    # ----------------------------------------------------------------- lifecycle
    def close(self) -> None:
        """Write pending retrieval counts, close the database and release the writer's lock."""
        if self._db is None:
            return
        self.sync_retrieval_stats()
        with self._lock:
            self._release()

    def __enter__(self) -> ExperienceBank:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- internals
    def _check_writable(self) -> None:
        if self.read_only:
            raise BankError(f"The experience bank {self.path} was opened read-only.")
        if self._db is None:
            raise BankError(f"The experience bank {self.path} is closed.")

    def _live(self, entry_id: str, gone: set[str], added: list[ExperienceEntry]) -> bool:
        if entry_id in gone:
            return False
        return entry_id in self._entries or any(e.id == entry_id for e in added)

    def _votes_of(self, entry_id: str) -> int:
        entry = self._entries.get(entry_id)
        return entry.votes if entry is not None else 0

    def _oldest_live(self, n: int, gone: set[str], added: list[ExperienceEntry]) -> list[str]:
        oldest: list[str] = []
        for entry_id in self._entries:
            if len(oldest) == n:
                return oldest
            if entry_id not in gone:
                oldest.append(entry_id)
        for entry in added:  # a transaction that adds more than the capacity
            if len(oldest) == n:
                break
            if entry.id not in gone:
                oldest.append(entry.id)
        return oldest

    def _evict_over_capacity_now(self) -> None:
        overflow = len(self._entries) - self.capacity
        if overflow <= 0:
            return
        victims = list(self._entries)[:overflow]
        with transaction(self._db, self.path):
            self._db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in victims])
        for entry_id in victims:
            self._mirror_remove(entry_id)
        self.evictions += len(victims)

    def _mirror_add(self, entry: ExperienceEntry) -> None:
        self._entries[entry.id] = entry
        self._partitions.setdefault(entry.env_id, {})[entry.id] = None

    def _mirror_remove(self, entry_id: str) -> None:
        entry = self._entries.pop(entry_id, None)
        if entry is not None:
            self._partitions[entry.env_id].pop(entry_id, None)
            self._stats_dirty.discard(entry_id)
