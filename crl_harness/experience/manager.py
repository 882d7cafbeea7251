"""The Experience Manager: the background track that owns the bank (docs/method.md, "The Experience
Manager and its asynchronous loop").

Holds:
- ``ExperienceManager``, the ``ExperienceClient`` of one process (``client``), which composes
  the parts in ``locks`` (``ReadWriteLock``), ``search`` (batching and indexing) and ``distill``
  (``DistillationRequest`` and the extractor's jobs):
  - retrieval (the retriever protocol of ``crl_wrappers.experience``): queries go to a queue, a
    batcher groups them (up to ``batch_size`` queries or ``batch_wait_s``, sent early once no
    query joined for ``batch_gap_s``) and ``search_workers`` threads serve the batches under the
    read lock, each scored in one matrix product (``search_many``); a query that finds nobody
    waiting to be batched and a free search slot is served in the caller's thread;
  - distillation: ``submit`` queues a request; ``max_concurrent_extractions`` threads call the
    extractor (any callable ``prompt -> str`` or an object with ``.text``), parse its answer
    strictly and apply the operations under the write lock;
  - merge passes (``merge_pass``) over chunks of ``merge_chunk`` entries, through the same queue;
  - an indexer thread that rebuilds the index of each changed partition off-lock and swaps it
    in, at most every ``reindex_interval_s`` or at once during ``flush`` (deleted entries are
    filtered at once; new ones are searchable after the rebuild);
  - ``flush`` waits until every queued job is applied and indexed (call it before a rollout
    phase); ``report_outcome``, ``generation_rewards`` and ``release_generations`` carry the
    extractor's credit (a generation's record stays until it is released, i.e. trained);
  - search-and-ask (``ask``): an actor's query mid-episode is answered by the extractor from the
    entries retrieved for it, in the caller's thread; ``report_ask_outcome`` credits the
    answering generations with the episode's outcome.

``ReadWriteLock``, ``DistillationRequest``, ``Extractor``, ``distill_prompt`` and
``ManagerConfig`` (``manager_config``) are still importable from here, as before the split.

Every public method takes and returns plain data, so the object can later run as a Ray actor.
"""

from __future__ import annotations

import queue
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from crl_harness.experience.ask import NO_KNOWLEDGE, AskAnswer, answer_prompt, parse_answer_text
from crl_harness.experience.bank import ExperienceBank
from crl_harness.experience.credit import CreditLedger, GenerationReward
from crl_harness.experience.distill import (
    DistillationRequest,
    Extractor,
    _ExtractorJobs,
    _numbered,
    distill_prompt,
)
from crl_harness.experience.entries import (
    AddEntry,
    ApplyResult,
    BankChange,
    DeleteEntries,
    ExperienceEntry,
    VoteEntry,
    same_text,
)
from crl_harness.experience.locks import ReadWriteLock
from crl_harness.experience.manager_config import ManagerConfig
from crl_harness.experience.prompts import load_prompt
from crl_harness.experience.retrieval import (
    BM25Index,
    DenseIndex,
    Embedder,
    query_coverage,
    tokenize,
)
from crl_harness.experience.search import _Query, _Search

__all__ = ["ReadWriteLock", "DistillationRequest", "ManagerConfig", "ExperienceManager",
           "Extractor", "distill_prompt"]


class ExperienceManager(_ExtractorJobs, _Search):
    """Owns an ``ExperienceBank``: batched retrieval, background distillation, credit.

    Example:
        >>> bank = ExperienceBank(":memory:")
        >>> answer = '<answer>[{"op": "add", "title": "Boxes", "content": "Never push a box into a corner."}]</answer>'
        >>> manager = ExperienceManager(bank, extractor=lambda prompt: answer)
        >>> manager.submit(DistillationRequest("CRL/Sokoban-v0", "push the boxes", "...", False, 0.0))
        >>> manager.flush()
        True
        >>> [e.text for e in manager.retrieve("CRL/Sokoban-v0", "push a box", k=1)]
        ['Boxes: Never push a box into a corner.']
        >>> manager.close(); bank.close()
    """

    def __init__(self, bank: ExperienceBank, extractor: Extractor | None = None,
                 config: ManagerConfig | None = None) -> None:
        config = config if config is not None else ManagerConfig()
        self.bank = bank
        self.config = config
        self._extractor = extractor
        self._distill_template = load_prompt("experience_distill")
        self._merge_template = load_prompt("experience_merge")
        self._embedder = Embedder(config.retrieval.embed_model) \
            if config.retrieval.index == "dense" else None
        self._rng = random.Random(config.seed)
        self._rw = ReadWriteLock()
        self.ledger = CreditLedger(config.max_pending_generations)
        self._entry_generation: OrderedDict[str, str | None] = OrderedDict()
        self._entry_generation_lock = threading.Lock()
        # Kept beside the bank (and in a checkpoint's ledger file): who endorsed an entry by
        # writing it again, and how its own level's episodes ended with it.
        self._endorsers: dict[str, list[str]] = {}
        self._outcomes: dict[str, tuple[int, int]] = {}
        # Each live entry's text as a repeat would write it (``same_text``), kept with the bank
        # under the write lock, so an add finds the entry it repeats without reading the bank.
        self._by_text: dict[tuple[str, str], str] = {}
        self._text_of: dict[str, tuple[str, str]] = {}
        self._index_texts(bank.entries())
        self._counters: dict[str, int] = dict.fromkeys(
            ("submitted", "distillations", "merges", "format_failures", "extractor_errors",
             "job_errors", "ops_applied", "retrievals", "retrieval_batches", "outcomes_reported",
             "index_rebuilds", "index_errors", "asks", "ask_format_failures", "endorsements",
             "misses_uncredited", "votes_ignored", "judgments"), 0)
        self._counters_lock = threading.Lock()
        # Jobs, pending count and index state share one condition (flush waits on all three).
        self._state = threading.Condition()
        self._pending = 0
        self._dirty: set[str] = set()
        self._indexing = False
        self._flushing = 0
        self._rebuilt_at: dict[str, float] = {}
        self._closed = False
        self._indexes: dict[str, BM25Index | DenseIndex] = {}
        self._features: dict[str, Any] = {}  # entry id -> tokens (BM25) or vector (dense)
        self._jobs: queue.Queue = queue.Queue()
        self._queries: queue.Queue = queue.Queue()
        self._busy_searches = 0
        self._waiting = 0  # queries queued or in the batch being collected
        self._busy_lock = threading.Lock()
        self._search_pool = ThreadPoolExecutor(config.search_workers,
                                               thread_name_prefix="experience-search")
        self._threads = [threading.Thread(target=self._extract_loop, daemon=True,
                                          name=f"experience-extract-{i}")
                         for i in range(config.max_concurrent_extractions)]
        self._threads.append(threading.Thread(target=self._batch_loop, daemon=True,
                                              name="experience-batcher"))
        self._threads.append(threading.Thread(target=self._index_loop, daemon=True,
                                              name="experience-indexer"))
        for env_id in bank.env_ids():
            self._rebuild(env_id)
        for thread in self._threads:
            thread.start()

    # ----------------------------------------------------------------- ExperienceClient
    def retrieve(self, env_id: str, query: str, k: int = 1) -> list[ExperienceEntry]:
        """Top-``k`` entries of ``env_id``'s partition for ``query`` (batched, shared lock)."""
        if not isinstance(env_id, str) or not isinstance(query, str):
            raise TypeError("retrieve(env_id, query, k) takes two strings and an int.")
        if k <= 0:
            return []
        if self._closed:
            raise RuntimeError("ExperienceManager is closed; create a new one to retrieve.")
        # Queries are tokenised here, in the caller, not on the batch's path (dense retrieval
        # needs the words only for the coverage floor and the level's own lessons).
        rcfg = self.config.retrieval
        tokens = tokenize(query) if rcfg.index == "bm25" or rcfg.floor(env_id) or \
            rcfg.keyed(env_id) else []
        request = _Query(env_id, query, int(k), tokens)
        if self._serve_here():
            # Nobody to batch with and a search slot free: serve in this thread, sparing the
            # two thread hand-offs (each can cost a scheduler time slice on a busy machine).
            self._serve(env_id, [request])
        else:
            self._queries.put(request)
        return request.wait()

    def report_outcome(self, entry_ids: Sequence[str], score: float,
                       critic: float | None = None, baseline: float | None = None,
                       env_id: str = "", query: str = "") -> None:
        """An episode that retrieved ``entry_ids`` ended with ``score``: credit their writers
        and endorsers (by the actor-critic gate's ``critic`` score when the gate judged the
        entries; relative to ``baseline``, its group's free mean score, when given:
        ``entry_credit``). Where ``env_id``'s key is exact, an entry of another level's key
        (a retrieval miss, ``query`` being the episode's) credits nobody and records nothing;
        one of its own records the win or loss (``_record_of``)."""
        generations: list[str | None] = []
        won = score >= 1.0
        with self._entry_generation_lock:
            for entry_id in entry_ids:
                entry = self.bank.get(entry_id)
                if entry is not None and not self.is_own(env_id, query, entry):
                    self._count("misses_uncredited")
                    continue
                if entry_id in self._entry_generation:
                    generations.append(self._entry_generation[entry_id])
                else:
                    generations.append(entry.generation_id if entry else None)
                generations.extend(self._endorsers.get(entry_id, ()))
                if entry is not None and self.config.retrieval.keyed(env_id):
                    wins, losses = self._outcomes.get(entry_id, (0, 0))
                    self._outcomes[entry_id] = (wins + won, losses + (not won))
        self.ledger.credit(generations, score, critic, baseline)
        self._count("outcomes_reported")

    def is_own(self, env_id: str, query: str, entry: ExperienceEntry) -> bool:
        """Whether ``entry`` belongs to the level of ``query``: it holds every word of the key
        where ``env_id``'s key is exact; anywhere else every entry counts as the level's."""
        if env_id and entry.env_id != env_id:
            return False
        if not self.config.retrieval.keyed(env_id):
            return True
        return query_coverage(tokenize(query), self._entry_tokens(entry)) >= 1.0

    def export_records(self) -> dict[str, Any]:
        """The endorsers and the use record of every entry (a checkpoint's)."""
        with self._entry_generation_lock:
            return {"endorsers": {k: list(v) for k, v in self._endorsers.items()},
                    "outcomes": dict(self._outcomes)}

    def load_records(self, records: dict[str, Any]) -> None:
        """Put back ``export_records``' (a resumed run's)."""
        with self._entry_generation_lock:
            self._endorsers = {str(k): list(v) for k, v in records.get("endorsers", {}).items()}
            self._outcomes = {str(k): (int(w), int(lost))
                              for k, (w, lost) in records.get("outcomes", {}).items()}

    # ----------------------------------------------------------------- search-and-ask
    def ask(self, env_id: str, query: str, k: int = 1) -> AskAnswer:
        """Answer an actor's query mid-episode: retrieve ``k`` entries of ``env_id``'s partition
        for it and let the extractor write the answer (registered for credit, kind ``ask``).

        Nothing found: ``NO_KNOWLEDGE`` and no generation. A malformed extractor answer shows
        the entries themselves (it is trained only with a format penalty, like a malformed
        distillation); an extractor that raises answers ``NO_KNOWLEDGE``.
        """
        self._count("asks")
        found = self.retrieve(env_id, query, k)
        if not found:
            return AskAnswer(NO_KNOWLEDGE)
        prompt = answer_prompt(env_id, query, _numbered(found))
        called = self._call_extractor(prompt)
        if called is None:
            return AskAnswer(NO_KNOWLEDGE)
        output, text = called
        generation_id = uuid.uuid4().hex
        answer = parse_answer_text(text)
        if answer is None:
            self._count("ask_format_failures")
            if self.config.format_failure_reward is not None:
                self.ledger.register(generation_id, prompt, output, "ask",
                                     fixed_reward=self.config.format_failure_reward)
            return AskAnswer("\n".join(f"- {e.text}" for e in found))
        self.ledger.register(generation_id, prompt, output, "ask")
        return AskAnswer(answer, generation_id)

    def report_ask_outcome(self, generation_ids: Sequence[str], score: float) -> None:
        """The episode whose asks ``generation_ids`` answered ended with ``score``: credit them
        as any generation whose entries were used (``episode_credit``)."""
        self.ledger.credit(generation_ids, score)

    # ----------------------------------------------------------------- background track
    def submit(self, request: DistillationRequest) -> None:
        """Queue a finished episode for distillation (returns at once)."""
        if not isinstance(request, DistillationRequest):
            raise TypeError(f"submit takes a DistillationRequest, got {type(request).__name__}.")
        self._enqueue(("distill", request))
        self._count("submitted")

    def merge_pass(self, env_id: str | None = None, max_chunks: int | None = None) -> int:
        """Queue a merge pass over ``env_id``'s partition (every partition when None), in chunks
        of ``merge_chunk`` entries, oldest first; returns the number of chunks queued."""
        queued = 0
        for env in ([env_id] if env_id is not None else self.bank.env_ids()):
            ids = [entry.id for entry in self.bank.entries(env)]
            size = self.config.merge_chunk
            for start in range(0, len(ids), size):
                chunk = ids[start:start + size]
                if len(chunk) < 2 or (max_chunks is not None and queued >= max_chunks):
                    continue
                self._enqueue(("merge", env, chunk))
                queued += 1
        return queued

    def apply(self, changes: Sequence[BankChange]) -> ApplyResult:
        """Apply bank changes under the exclusive write lock and schedule re-indexing. An add
        whose text equals a live entry of its env (whitespace and case aside; ``same_text``) is
        folded into that entry: an upvote, and its generation joins the entry's endorsers, who
        are credited as its writer is."""
        with self._rw.write():
            changes, endorsed = self._fold_repeats(changes)
            result = self.bank.apply(changes)
            with self._entry_generation_lock:
                for entry_id, generation_id in endorsed:
                    if entry_id in self.bank and generation_id:
                        self._endorsers.setdefault(entry_id, []).append(generation_id)
                for gone in result.deleted + result.evicted:
                    self._endorsers.pop(gone, None)
                    self._outcomes.pop(gone, None)
                    key = self._text_of.pop(gone, None)
                    if key is not None and self._by_text.get(key) == gone:
                        del self._by_text[key]
            self._index_texts(e for e in result.added if e.id in self.bank)
        if endorsed:
            self._count("endorsements", len(endorsed))
        if result.envs:
            with self._state:
                self._dirty |= result.envs
                self._state.notify_all()
        return result

    def _fold_repeats(self, changes: Sequence[BankChange]
                      ) -> tuple[list[BankChange], list[tuple[str, str | None]]]:
        """``changes`` with each add that repeats a live entry (or an earlier add of the same
        changes) turned into an upvote of it; returns them and the (entry, generation) pairs
        endorsed. Called under the write lock."""
        deleted = {i for c in changes if isinstance(c, DeleteEntries) for i in c.ids}
        out: list[BankChange] = []
        endorsed: list[tuple[str, str | None]] = []
        seen: set[tuple[str, str]] = set()
        for change in changes:
            if isinstance(change, AddEntry):
                key = (change.env_id, same_text(change.title, change.content))
                target = self._by_text.get(key)
                if target is not None and target not in deleted:
                    out.append(VoteEntry(target, 1))
                    endorsed.append((target, change.generation_id))
                    continue
                if key in seen:
                    continue
                seen.add(key)
            out.append(change)
        return out, endorsed

    def _index_texts(self, entries: Iterable[ExperienceEntry]) -> None:
        for entry in entries:
            key = (entry.env_id, same_text(entry.title, entry.content))
            self._by_text.setdefault(key, entry.id)
            self._text_of[entry.id] = key

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued job is applied and indexed; False if ``timeout`` ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._state:
            self._flushing += 1  # the indexer rebuilds at once while someone waits
            self._state.notify_all()
            try:
                while self._pending or self._dirty or self._indexing:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._state.wait(remaining)
            finally:
                self._flushing -= 1
        self.bank.sync_retrieval_stats()
        return True

    def generation_rewards(self, min_uses: int = 1) -> list[GenerationReward]:
        """Extractor generations whose entries were used (and, with a format penalty, malformed
        ones), each with its mean credit so far; they stay until ``release_generations``."""
        return self.ledger.rewards(min_uses)

    def release_generations(self, generation_ids: Sequence[str]) -> int:
        """Forget generations that were trained on; returns how many were awaiting training."""
        return self.ledger.release(generation_ids)

    def drain_generation_rewards(self, min_uses: int = 1) -> list[GenerationReward]:
        """``generation_rewards`` and their release at once (one-shot readers)."""
        return self.ledger.drain(min_uses)

    def set_extractor(self, extractor: Extractor) -> None:
        """Use a new extractor (e.g. after its weights were updated) for the next jobs."""
        self._extractor = extractor

    def stats(self) -> dict[str, Any]:
        """Counters of the manager and the bank."""
        with self._counters_lock:
            out: dict[str, Any] = dict(self._counters)
        with self._state:
            out["pending"] = self._pending
            out["index_dirty"] = len(self._dirty) + int(self._indexing)
        out["bank_size"] = len(self.bank)
        out["partitions"] = {env: self.bank.count(env) for env in self.bank.env_ids()}
        out["evictions"] = self.bank.evictions
        out["generations_awaiting_credit"] = len(self.ledger)
        out["mean_batch_size"] = out["retrievals"] / max(1, out["retrieval_batches"])
        return out

    def close(self, flush: bool = True, timeout: float | None = None) -> None:
        """Finish (or, with ``flush=False``, drop) queued jobs, stop every thread, sync counts.

        The bank stays open: it belongs to the caller.
        """
        if self._closed:
            return
        try:
            if flush:
                self.flush(timeout)  # may raise (a full disk): the threads are stopped anyway
        finally:
            self._stop_threads(drop_queued=not flush)
        self.bank.sync_retrieval_stats()

    def _stop_threads(self, drop_queued: bool) -> None:
        with self._state:
            self._closed = True
            self._state.notify_all()
        if drop_queued:
            self._drop_queued_jobs()
        for _ in range(self.config.max_concurrent_extractions):
            self._jobs.put(None)
        self._queries.put(None)
        for thread in self._threads:
            thread.join()
        self._search_pool.shutdown(wait=True)
        while True:  # a query that raced with close must not wait forever
            try:
                late = self._queries.get_nowait()
            except queue.Empty:
                break
            if late is not None:
                late.answer(error=RuntimeError("ExperienceManager closed."))

    def __enter__(self) -> ExperienceManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self._counters[name] += n
