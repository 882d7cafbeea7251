"""Retrieval serving of the Experience Manager: batched queries over an index per partition,
rebuilt in the background (docs/method.md, "The Experience Manager and its asynchronous loop").

Holds:
- ``_Query``: one caller's retrieval on its way through a batch.
- ``_Search``: the serving methods of ``ExperienceManager`` (its base class):
  - batching: queries go to a queue, a batcher groups them (up to ``batch_size`` queries or
    ``batch_wait_s``, sent early once no query joined for ``batch_gap_s``) and
    ``search_workers`` threads serve the batches under the read lock, each scored in one matrix
    product (``search_many``); a query that finds nobody waiting to be batched and a free search
    slot is served in the caller's thread (``_serve_here``);
  - indexing: an indexer thread rebuilds the index of each changed partition off-lock and swaps
    it in, at most every ``reindex_interval_s`` or at once during ``flush``.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crl_harness.experience.bank import ExperienceBank
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.experience.locks import ReadWriteLock
from crl_harness.experience.manager_config import ManagerConfig
from crl_harness.experience.retrieval import (
    BM25Index,
    DenseIndex,
    Embedder,
    diversity_rerank,
    query_coverage,
    tokenize,
)

__all__: list[str] = []  # the manager's own: every name here is private

log = logging.getLogger(__name__)


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class _Query:
    """One caller's retrieval on its way through a batch. ``answer`` releases a lock the caller
    waits on: a bare lock, not a ``Future``, whose condition variable the woken caller would
    re-acquire and whose objects the garbage collector would track, 64 times a burst."""

    env_id: str
    query: str
    k: int
    tokens: list[str] = field(default_factory=list)  # BM25: tokenised by the caller
    result: list[ExperienceEntry] = field(default_factory=list)
    error: BaseException | None = None
    answered: bool = False
    _ready: threading.Lock = field(default_factory=_held_lock)

    def answer(self, result: list[ExperienceEntry] | None = None,
               error: BaseException | None = None) -> None:
        """Set the result (or the error) once and wake the caller; later answers are ignored."""
        if self.answered:
            return
        self.answered = True
        self.result, self.error = result or [], error
        self._ready.release()

    def wait(self) -> list[ExperienceEntry]:
        self._ready.acquire()
        if self.error is not None:
            raise self.error
        return self.result


class _Search:
    """The retrieval and indexing methods of ``ExperienceManager`` (its base class). The manager
    sets the attributes below, provides ``_count`` and calls ``_rebuild`` for each partition
    before its threads (``_batch_loop``, ``_index_loop``) start."""

    bank: ExperienceBank
    config: ManagerConfig
    _rw: ReadWriteLock
    _rng: random.Random
    _embedder: Embedder | None
    _entry_generation: OrderedDict[str, str | None]
    _entry_generation_lock: threading.Lock
    # retrieval
    _queries: queue.Queue
    _busy_searches: int
    _waiting: int
    _busy_lock: threading.Lock
    _search_pool: ThreadPoolExecutor
    # indexing (``_state`` is shared with the jobs: flush waits on both)
    _state: threading.Condition
    _pending: int
    _dirty: set[str]
    _indexing: bool
    _flushing: int
    _rebuilt_at: dict[str, float]
    _closed: bool
    _indexes: dict[str, BM25Index | DenseIndex]
    _features: dict[str, Any]
    _outcomes: dict[str, tuple[int, int]]  # entry id -> wins, losses of its level's episodes

    # ----------------------------------------------------------------- retrieval
    def _batch_loop(self) -> None:
        cfg = self.config
        while True:
            first = self._queries.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + cfg.batch_wait_s
            stop = False
            while len(batch) < cfg.batch_size:
                remaining = min(cfg.batch_gap_s, deadline - time.monotonic())
                try:
                    item = self._queries.get(timeout=remaining) if remaining > 0 \
                        else self._queries.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            by_env: dict[str, list[_Query]] = {}
            for query in batch:
                by_env.setdefault(query.env_id, []).append(query)
            with self._busy_lock:
                self._waiting -= sum(len(queries) for queries in by_env.values())
                self._busy_searches += len(by_env)
            for env_id, queries in by_env.items():
                self._search_pool.submit(self._serve, env_id, queries)
            if stop:
                return

    def _serve_here(self) -> bool:
        """Whether a query is served in the caller's thread: no query waits to be batched and a
        search slot is free (then claimed). Otherwise the query counts as waiting, so that the
        queries of a burst join the batch being collected rather than each serving itself."""
        with self._busy_lock:
            if not self._waiting and self._busy_searches < self.config.search_workers:
                self._busy_searches += 1
                return True
            self._waiting += 1
            return False

    def _serve(self, env_id: str, queries: list[_Query]) -> None:
        """Answer ``queries`` (one search slot, claimed by the caller, is released here)."""
        try:
            self._count("retrieval_batches")
            self._count("retrievals", len(queries))
            cfg = self.config.retrieval
            index = self._indexes.get(env_id)
            if index is None:
                hits: list[list[tuple[str, float]]] = [[] for _ in queries]
            elif isinstance(index, DenseIndex):
                vectors = self._embedder.encode([q.query for q in queries])  # type: ignore[union-attr]
                hits = index.search_many(vectors, cfg.candidates)
            else:
                hits = index.search_tokens_many([q.tokens for q in queries], cfg.candidates)
            results = []
            floor, keyed = cfg.floor(env_id), cfg.keyed(env_id)
            with self._rw.read():
                now = time.time()
                for query, found in zip(queries, hits, strict=True):
                    live = [(e, s) for e, s in ((self.bank.get(i), s) for i, s in found) if e]
                    if floor or keyed:  # the words of the query each entry holds
                        coverage = {e.id: query_coverage(query.tokens, self._entry_tokens(e))
                                    for e, _ in live}
                        live = [(e, s) for e, s in live if coverage[e.id] >= floor]
                    # the level's own lessons (its exact key) rank by their record first
                    own = {e.id: self._record_of(e) for e, _ in live
                           if coverage[e.id] >= 1.0} if keyed else None
                    chosen = diversity_rerank(live, query.k, cfg, now, self._rng, own)
                    self.bank.record_retrievals([e.id for e in chosen], now)
                    results.append(chosen)
            self._remember_generations(results)
            for query, chosen in zip(queries, results, strict=True):
                query.answer(chosen)
        except BaseException as err:  # the caller gets the error instead of waiting forever
            for query in queries:
                query.answer(error=err)
        finally:
            with self._busy_lock:
                self._busy_searches -= 1

    def _record_of(self, entry: ExperienceEntry) -> float:
        """An entry's record: its votes (endorsements included) plus its wins minus its losses
        when an episode of its own level used it."""
        wins, losses = self._outcomes.get(entry.id, (0, 0))
        return entry.votes + wins - losses

    def _entry_tokens(self, entry: ExperienceEntry) -> tuple[str, ...]:
        """The words the BM25 index holds for ``entry`` (tokenised once, when indexed)."""
        tokens = self._features.get(entry.id)
        return tokens if isinstance(tokens, tuple) else tuple(tokenize(entry.text))

    def _remember_generations(self, results: list[list[ExperienceEntry]]) -> None:
        with self._entry_generation_lock:
            for chosen in results:
                for entry in chosen:
                    self._entry_generation[entry.id] = entry.generation_id
                    self._entry_generation.move_to_end(entry.id)
            while len(self._entry_generation) > 4 * self.bank.capacity:
                self._entry_generation.popitem(last=False)

    # ----------------------------------------------------------------- indexing
    def _index_loop(self) -> None:
        while True:
            with self._state:
                while True:
                    if self._closed and not self._dirty:
                        return
                    now = time.monotonic()
                    # A flush re-indexes once its jobs are all applied, not after each of them.
                    flushing = self._flushing and not self._pending
                    due = {env for env in self._dirty if flushing or self._closed
                           or now - self._rebuilt_at.get(env, -1e9) >= self.config.reindex_interval_s}
                    if due:
                        break
                    waits = [self._rebuilt_at[env] + self.config.reindex_interval_s - now
                             for env in self._dirty]
                    self._state.wait(min(waits) if waits else None)
                self._dirty -= due
                self._indexing = True
            for env_id in due:
                try:
                    self._rebuild(env_id)
                except Exception:
                    log.exception("re-indexing %s failed; it keeps its previous index", env_id)
                    self._count("index_errors")
            with self._state:
                self._indexing = False
                self._state.notify_all()

    def _rebuild(self, env_id: str) -> None:
        """Index ``env_id``'s live entries; each entry's tokens or vector is computed once."""
        with self._rw.read():
            entries = self.bank.entries(env_id)
        ids = [e.id for e in entries]
        new = [e for e in entries if e.id not in self._features]
        if self._embedder is None:
            for entry in new:
                # A tuple of strings: the garbage collector stops tracking it (20k entries' token
                # lists made every full collection of the process tens of ms longer).
                self._features[entry.id] = tuple(tokenize(entry.text))
            rcfg = self.config.retrieval
            index: BM25Index | DenseIndex = BM25Index(
                ids, [self._features[i] for i in ids], rcfg.k1, rcfg.b)
        else:
            vectors = self._embedder.encode([e.text for e in new])
            for entry, vector in zip(new, vectors, strict=True):
                self._features[entry.id] = vector
            matrix = np.stack([self._features[i] for i in ids]) if ids else \
                np.zeros((0, self._embedder.dim), dtype=np.float32)
            index = DenseIndex(ids, matrix)
        self._indexes[env_id] = index
        for stale in [i for i in self._features if i not in self.bank]:
            del self._features[stale]
        self._rebuilt_at[env_id] = time.monotonic()
        self._count("index_rebuilds")
