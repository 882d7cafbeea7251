"""Retrieval serving of the Experience Manager: an index per partition, searched in batches and
rebuilt in the background (docs/method.md, "The Experience Manager and its asynchronous loop").

Holds:
- ``Query``: one caller's retrieval on its way through a batch.
- ``Retriever``: the index of each partition (BM25 or dense), and a batch of queries' entries
  through it: the candidates, the coverage floor, the level's own lessons by their record, the
  diversity re-rank. It starts no thread: its callers serialise the rebuilds.
- ``SearchBatcher``: queries go to a queue, a batcher thread groups them (up to ``batch_size``
  queries or ``batch_wait_s``, sent early once no query joined for ``batch_gap_s``) and
  ``search_workers`` threads serve the batches, each scored in one matrix product
  (``search_many``); a query that finds nobody waiting to be batched and a free search slot is
  served in the caller's thread.
- ``Indexer``: a thread that rebuilds each changed partition's index off-lock and swaps it in,
  at most every ``reindex_interval_s`` or at once while a flush waits (``TrackState``).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from crl_harness.experience.bank import ExperienceBank
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.experience.locks import ReadWriteLock
from crl_harness.experience.manager_config import ManagerConfig
from crl_harness.experience.records import LessonRecords
from crl_harness.experience.retrieval import (
    BM25Index,
    DenseIndex,
    Embedder,
    RetrievalConfig,
    diversity_rerank,
    query_coverage,
    tokenize,
)
from crl_harness.experience.track import Counters, TrackState

__all__ = ["Query", "Retriever", "SearchBatcher", "Indexer"]

log = logging.getLogger(__name__)


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass(eq=False)
class Query:
    """One caller's retrieval on its way through a batch. ``answer`` releases a lock the caller
    waits on: a bare lock, not a ``Future``, whose condition variable the woken caller would
    re-acquire and whose objects the garbage collector would track, 64 times a burst."""

    env_id: str
    query: str
    k: int
    tokens: list[str] = field(default_factory=list)  # tokenised by the caller, where needed
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
        """The result, once answered (the error raised here, in the caller)."""
        self._ready.acquire()
        if self.error is not None:
            raise self.error
        return self.result


class Retriever:
    """The index of each partition of ``bank`` and the entries a batch of queries retrieves.

    It reads the bank under ``lock``'s shared side, ranks a level's own lessons by their record
    in ``records`` (and remembers the writers of what it returns there), counts retrievals and
    rebuilds in ``counters`` and re-ranks with a ``seed``-ed random generator.

    Example:
        >>> from crl_harness.experience import ExperienceBank
        >>> bank = ExperienceBank(":memory:")
        >>> _ = bank.add("CRL/Sokoban-v0", "Boxes", "Never push a box into a corner.")
        >>> retriever = Retriever(bank, RetrievalConfig(), ReadWriteLock(), LessonRecords(8),
        ...                       Counters(Retriever.COUNTERS))
        >>> retriever.rebuild("CRL/Sokoban-v0")
        >>> [found] = retriever.search("CRL/Sokoban-v0", [
        ...     retriever.query("CRL/Sokoban-v0", "push a box", 1)])
        >>> [e.title for e in found]
        ['Boxes']
    """

    COUNTERS = ("retrievals", "retrieval_batches", "index_rebuilds")

    def __init__(self, bank: ExperienceBank, config: RetrievalConfig, lock: ReadWriteLock,
                 records: LessonRecords, counters: Counters, seed: int = 0) -> None:
        self.bank = bank
        self.config = config
        self._lock = lock
        self._records = records
        self._counters = counters
        self._rng = random.Random(seed)
        self._embedder = Embedder(config.embed_model) if config.experience.retrieval == "dense" else None
        self._indexes: dict[str, BM25Index | DenseIndex] = {}
        self._features: dict[str, Any] = {}  # entry id -> tokens (BM25) or vector (dense)

    def query(self, env_id: str, query: str, k: int) -> Query:
        """A query of ``k`` entries, tokenised here, in the caller, not on the batch's path
        (dense retrieval needs the words only for the coverage floor and the level's own
        lessons)."""
        cfg = self.config
        wants_words = cfg.experience.retrieval == "bm25" or cfg.floor(env_id) or cfg.keyed(env_id)
        return Query(env_id, query, int(k), tokenize(query) if wants_words else [])

    def search(self, env_id: str, queries: Sequence[Query]) -> list[list[ExperienceEntry]]:
        """Each query's entries of ``env_id``'s partition: its candidates by the index, those
        under the coverage floor dropped, the level's own lessons (its exact key) first by
        their record, then the diversity re-rank; their retrievals are recorded in the bank."""
        self._counters.add("retrieval_batches")
        self._counters.add("retrievals", len(queries))
        cfg = self.config
        index = self._indexes.get(env_id)
        if index is None:
            hits: list[list[tuple[str, float]]] = [[] for _ in queries]
        elif isinstance(index, DenseIndex):
            vectors = self._embedder.encode([q.query for q in queries])  # type: ignore[union-attr]
            hits = index.search_many(vectors, cfg.experience.candidates)
        else:
            hits = index.search_tokens_many([q.tokens for q in queries], cfg.experience.candidates)
        results = []
        floor, keyed = cfg.floor(env_id), cfg.keyed(env_id)
        with self._lock.read():
            now = time.time()
            for query, found in zip(queries, hits, strict=True):
                live = [(e, s) for e, s in ((self.bank.get(i), s) for i, s in found) if e]
                if floor or keyed:  # the words of the query each entry holds
                    coverage = {e.id: query_coverage(query.tokens, self.entry_tokens(e))
                                for e, _ in live}
                    live = [(e, s) for e, s in live if coverage[e.id] >= floor]
                own = {e.id: self._records.record_of(e) for e, _ in live
                       if coverage[e.id] >= 1.0} if keyed else None
                chosen = diversity_rerank(live, query.k, cfg, now, self._rng, own)
                self.bank.record_retrievals([e.id for e in chosen], now)
                results.append(chosen)
        self._records.remember_retrieved(results)
        return results

    def is_own(self, env_id: str, query: str, entry: ExperienceEntry) -> bool:
        """Whether ``entry`` belongs to the level of ``query``: it holds every word of the key
        where ``env_id``'s key is exact; anywhere else every entry counts as the level's."""
        if env_id and entry.env_id != env_id:
            return False
        if not self.config.keyed(env_id):
            return True
        return query_coverage(tokenize(query), self.entry_tokens(entry)) >= 1.0

    def entry_tokens(self, entry: ExperienceEntry) -> tuple[str, ...]:
        """The words the BM25 index holds for ``entry`` (tokenised once, when indexed)."""
        tokens = self._features.get(entry.id)
        return tokens if isinstance(tokens, tuple) else tuple(tokenize(entry.text))

    def rebuild(self, env_id: str) -> None:
        """Index ``env_id``'s live entries; each entry's tokens or vector is computed once."""
        with self._lock.read():
            entries = self.bank.entries(env_id)
        ids = [e.id for e in entries]
        new = [e for e in entries if e.id not in self._features]
        if self._embedder is None:
            for entry in new:
                # A tuple of strings: the garbage collector stops tracking it (20k entries' token
                # lists made every full collection of the process tens of ms longer).
                self._features[entry.id] = tuple(tokenize(entry.text))
            index: BM25Index | DenseIndex = BM25Index(
                ids, [self._features[i] for i in ids], self.config.k1, self.config.b)
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
        self._counters.add("index_rebuilds")


class SearchBatcher:
    """Serves ``retriever``'s queries in batches (``config``'s ``batch_size``, ``batch_wait_s``,
    ``batch_gap_s``, ``search_workers``) from a batcher thread, started by ``start``."""

    def __init__(self, retriever: Retriever, config: ManagerConfig) -> None:
        self._retriever = retriever
        self._config = config
        self._queries: queue.Queue = queue.Queue()
        self._busy_searches = 0
        self._waiting = 0  # queries queued or in the batch being collected
        self._busy_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(config.search_workers,
                                        thread_name_prefix="experience-search")
        self._thread = threading.Thread(target=self._batch_loop, daemon=True,
                                        name="experience-batcher")

    def start(self) -> None:
        """Start the batcher thread."""
        self._thread.start()

    def retrieve(self, env_id: str, query: str, k: int) -> list[ExperienceEntry]:
        """``query``'s top-``k`` entries of ``env_id``'s partition, served here or batched."""
        request = self._retriever.query(env_id, query, k)
        if self._serve_here():
            # Nobody to batch with and a search slot free: serve in this thread, sparing the
            # two thread hand-offs (each can cost a scheduler time slice on a busy machine).
            self._serve(env_id, [request])
        else:
            self._queries.put(request)
        return request.wait()

    def stop(self) -> None:
        """Stop the batcher and the search threads; a query that raced with it gets an error."""
        self._queries.put(None)
        self._thread.join()
        self._pool.shutdown(wait=True)
        while True:  # a query that raced with the stop must not wait forever
            try:
                late = self._queries.get_nowait()
            except queue.Empty:
                break
            if late is not None:
                late.answer(error=RuntimeError("ExperienceManager closed."))

    def _batch_loop(self) -> None:
        cfg = self._config
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
            by_env: dict[str, list[Query]] = {}
            for request in batch:
                by_env.setdefault(request.env_id, []).append(request)
            with self._busy_lock:
                self._waiting -= sum(len(requests) for requests in by_env.values())
                self._busy_searches += len(by_env)
            for env_id, requests in by_env.items():
                self._pool.submit(self._serve, env_id, requests)
            if stop:
                return

    def _serve_here(self) -> bool:
        """Whether a query is served in the caller's thread: no query waits to be batched and a
        search slot is free (then claimed). Otherwise the query counts as waiting, so that the
        queries of a burst join the batch being collected rather than each serving itself."""
        with self._busy_lock:
            if not self._waiting and self._busy_searches < self._config.search_workers:
                self._busy_searches += 1
                return True
            self._waiting += 1
            return False

    def _serve(self, env_id: str, requests: list[Query]) -> None:
        """Answer ``requests`` (one search slot, claimed by the caller, is released here)."""
        try:
            results = self._retriever.search(env_id, requests)
            for request, chosen in zip(requests, results, strict=True):
                request.answer(chosen)
        except BaseException as err:  # the caller gets the error instead of waiting forever
            for request in requests:
                request.answer(error=err)
        finally:
            with self._busy_lock:
                self._busy_searches -= 1


class Indexer:
    """Rebuilds ``retriever``'s index of each partition ``track`` marks dirty, in a thread
    started by ``start``, at most every ``interval_s`` a partition; stops once ``track`` is
    closed and nothing is dirty. A failed rebuild keeps the previous index (``index_errors``
    in ``counters``)."""

    def __init__(self, retriever: Retriever, track: TrackState, interval_s: float,
                 counters: Counters) -> None:
        self._retriever = retriever
        self._track = track
        self._interval_s = interval_s
        self._counters = counters
        self._rebuilt_at: dict[str, float] = {}
        self._thread = threading.Thread(target=self._index_loop, daemon=True,
                                        name="experience-indexer")

    def rebuild(self, env_ids: Iterable[str]) -> None:
        """Rebuild these partitions' indexes now, in this thread (before ``start``)."""
        for env_id in env_ids:
            self._retriever.rebuild(env_id)
            self._rebuilt_at[env_id] = time.monotonic()

    def start(self) -> None:
        """Start the indexer thread."""
        self._thread.start()

    def join(self) -> None:
        """Wait for the thread, which ends once the track is closed and indexed."""
        self._thread.join()

    def _index_loop(self) -> None:
        while (due := self._track.next_due(self._interval_s, self._rebuilt_at)) is not None:
            for env_id in due:
                try:
                    self.rebuild([env_id])
                except Exception:
                    log.exception("re-indexing %s failed; it keeps its previous index", env_id)
                    self._counters.add("index_errors")
            self._track.indexed()
