"""The Experience Manager: the background track that owns the bank (docs/method.md, "The Experience
Manager and its asynchronous loop").

Holds:
- ``ReadWriteLock``: shared readers, exclusive writers, phase-fair (a waiting writer blocks new
  readers, so writers are not starved; readers waiting at a write release go next).
- ``DistillationRequest``: one finished episode sent for distillation.
- ``ManagerConfig``: every setting of the manager.
- ``ExperienceManager``:
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

Every public method takes and returns plain data, so the object can later run as a Ray actor.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from string import Template
from typing import Any

import numpy as np

from crl_harness.experience.ask import NO_KNOWLEDGE, AskAnswer, answer_prompt, parse_answer_text
from crl_harness.experience.bank import (
    AddEntry,
    ApplyResult,
    BankChange,
    BankError,
    DeleteEntries,
    ExperienceBank,
    ExperienceEntry,
    VoteEntry,
)
from crl_harness.experience.credit import CreditLedger, GenerationReward
from crl_harness.experience.operations import (
    Add,
    Discard,
    Merge,
    Operation,
    ParseLimits,
    Rewrite,
    Update,
    Vote,
    parse_distillation,
    parse_merge,
)
from crl_harness.experience.prompts import load_prompt
from crl_harness.experience.retrieval import (
    BM25Index,
    DenseIndex,
    Embedder,
    RetrievalConfig,
    diversity_rerank,
    tokenize,
)

__all__ = ["ReadWriteLock", "DistillationRequest", "ManagerConfig", "ExperienceManager",
           "Extractor", "distill_prompt"]

log = logging.getLogger(__name__)

Extractor = Callable[[str], Any]


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


@dataclass(frozen=True)
class DistillationRequest:
    """A finished episode for the extractor: what happened and which entries it was given."""

    env_id: str
    task: str
    transcript: str
    won: bool
    score: float
    retrieved_ids: list[str] = field(default_factory=list)
    step: int = 0


@dataclass(frozen=True)
class ManagerConfig:
    """Settings of the Experience Manager (defaults: the released configuration, but for the
    retrieval batching: one batch per burst of a 64-episode rollout batch, scored by one
    search worker; ``benchmarks/experience_bench.py`` measures the burst)."""

    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    max_concurrent_extractions: int = 4
    """Extractor calls in flight at once."""
    batch_size: int = 64
    """Most retrieval queries served as one batch (released: 32; 64 is a rollout batch, whose
    episodes reset together)."""
    batch_wait_s: float = 0.005
    """Longest a query waits for its batch to fill."""
    batch_gap_s: float = 0.0005
    """A batch is sent once no query joined it for this long: the queries of a burst (episodes
    that reset together) are scored in one pass, and a few concurrent ones do not wait
    ``batch_wait_s``. A query that arrives alone is served at once, in the caller's thread."""
    search_workers: int = 1
    """Threads that serve retrieval batches under the shared read lock (released: 4). A batch is
    one matrix product, and more threads mostly wait for the GIL: with 4, a burst of 64 forms
    smaller batches and its p99 is higher."""
    merge_chunk: int = 5
    """Entries shown to the extractor per merge-pass call."""
    max_transcript_chars: int = 12_000
    """Longer transcripts keep their head and tail."""
    parse_limits: ParseLimits = field(default_factory=ParseLimits)
    format_failure_reward: float | None = None
    """Reward of a generation whose answer was malformed, which then joins the extractor's batch
    (an opt-in format penalty, e.g. -1). None, the default as in the released code: such a
    generation wrote nothing that could be used, so it is not trained."""
    max_pending_generations: int = 10_000
    reindex_interval_s: float = 30.0
    """A changed partition is re-indexed at most this often, and at once while ``flush`` waits.
    A BM25 rebuild holds the GIL for ~60 ms per 1,000 entries, so rebuilding after every write
    slows rollouts in the same process; the harness flushes before each rollout phase anyway."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("max_concurrent_extractions", "batch_size", "search_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"ManagerConfig.{name} must be at least 1.")
        if self.merge_chunk < 2:
            raise ValueError("ManagerConfig.merge_chunk must be at least 2.")
        for name in ("batch_wait_s", "batch_gap_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ManagerConfig.{name} must be a number of seconds >= 0.")


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


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


def _numbered(entries: Sequence[ExperienceEntry]) -> str:
    if not entries:
        return "(none)"
    return "\n".join(f"[{i}] {e.title}: {e.content}" for i, e in enumerate(entries))


def distill_prompt(request: DistillationRequest, shown: Sequence[ExperienceEntry], *,
                   max_ops: int, max_transcript_chars: int,
                   template: Template | None = None) -> str:
    """The extractor's prompt for one finished episode and the entries it was shown (the
    manager's, and the warm start's extractor samples, so both see the same text)."""
    template = template or load_prompt("experience_distill")
    return template.substitute(
        env_id=request.env_id, task=request.task,
        outcome="SUCCESS" if request.won else "FAILURE", score=f"{request.score:g}",
        retrieved=_numbered(shown), max_ops=max_ops,
        transcript=_clip(request.transcript, max_transcript_chars))


class ExperienceManager:
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
                 config: ManagerConfig = ManagerConfig()) -> None:
        self.bank = bank
        self.config = config
        self._extractor = extractor
        self._distill_template = load_prompt("experience_distill")
        self._merge_template = load_prompt("experience_merge")
        self._embedder = Embedder(config.retrieval.embed_model) \
            if config.retrieval.backend == "dense" else None
        self._rng = random.Random(config.seed)
        self._rw = ReadWriteLock()
        self.ledger = CreditLedger(config.max_pending_generations)
        self._entry_generation: OrderedDict[str, str | None] = OrderedDict()
        self._entry_generation_lock = threading.Lock()
        self._counters: dict[str, int] = dict.fromkeys(
            ("submitted", "distillations", "merges", "format_failures", "extractor_errors",
             "job_errors", "ops_applied", "retrievals", "retrieval_batches", "outcomes_reported",
             "index_rebuilds", "index_errors", "asks", "ask_format_failures"), 0)
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

    # ----------------------------------------------------------------- retriever protocol
    def retrieve(self, env_id: str, query: str, k: int = 1) -> list[ExperienceEntry]:
        """Top-``k`` entries of ``env_id``'s partition for ``query`` (batched, shared lock)."""
        if not isinstance(env_id, str) or not isinstance(query, str):
            raise TypeError("retrieve(env_id, query, k) takes two strings and an int.")
        if k <= 0:
            return []
        if self._closed:
            raise RuntimeError("ExperienceManager is closed; create a new one to retrieve.")
        # BM25 queries are tokenised here, in the caller, not on the batch's path.
        tokens = tokenize(query) if self.config.retrieval.backend == "bm25" else []
        request = _Query(env_id, query, int(k), tokens)
        if self._serve_here():
            # Nobody to batch with and a search slot free: serve in this thread, sparing the
            # two thread hand-offs (each can cost a scheduler time slice on a busy machine).
            self._serve(env_id, [request])
        else:
            self._queries.put(request)
        return request.wait()

    def report_outcome(self, entry_ids: Sequence[str], score: float,
                       critic: float | None = None, baseline: float | None = None) -> None:
        """An episode that retrieved ``entry_ids`` ended with ``score``: credit their writers
        (by the actor-critic gate's ``critic`` score when the gate judged the entries; relative
        to ``baseline``, its group's free mean score, when given: ``entry_credit``)."""
        generations = []
        with self._entry_generation_lock:
            for entry_id in entry_ids:
                if entry_id in self._entry_generation:
                    generations.append(self._entry_generation[entry_id])
                else:
                    entry = self.bank.get(entry_id)
                    generations.append(entry.generation_id if entry else None)
        self.ledger.credit(generations, score, critic, baseline)
        self._count("outcomes_reported")

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
        """Apply bank changes under the exclusive write lock and schedule re-indexing."""
        with self._rw.write():
            result = self.bank.apply(changes)
        if result.envs:
            with self._state:
                self._dirty |= result.envs
                self._state.notify_all()
        return result

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

    # ----------------------------------------------------------------- jobs
    def _enqueue(self, job: tuple) -> None:
        with self._state:
            if self._closed:
                raise RuntimeError("ExperienceManager is closed; no new jobs are accepted.")
            self._pending += 1
        self._jobs.put(job)

    def _drop_queued_jobs(self) -> None:
        while True:
            try:
                self._jobs.get_nowait()
            except queue.Empty:
                break
            self._job_done()

    def _job_done(self) -> None:
        with self._state:
            self._pending -= 1
            self._state.notify_all()

    def _extract_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                if job[0] == "distill":
                    self._distill(job[1])
                else:
                    self._merge(job[1], job[2])
            except (OSError, BankError) as err:  # a full disk, a read-only file: said in a line
                log.error("experience job %s failed: %s", job[0], err)
                self._count("job_errors")
            except Exception:  # a bug in one job must not stop the background track
                log.exception("experience job %s failed", job[0])
                self._count("job_errors")
            finally:
                self._job_done()

    def _call_extractor(self, prompt: str) -> tuple[Any, Any] | None:
        extractor = self._extractor
        if extractor is None:
            raise RuntimeError("ExperienceManager has no extractor; call set_extractor first.")
        try:
            output = extractor(prompt)
        except Exception:
            log.exception("the extractor raised; the job applies nothing")
            self._count("extractor_errors")
            return None
        return output, (output if isinstance(output, str) else getattr(output, "text", output))

    def _distill(self, request: DistillationRequest) -> None:
        shown = [e for e in (self.bank.get(i) for i in request.retrieved_ids) if e is not None]
        prompt = distill_prompt(request, shown, max_ops=self.config.parse_limits.max_ops,
                                max_transcript_chars=self.config.max_transcript_chars,
                                template=self._distill_template)
        called = self._call_extractor(prompt)
        if called is None:
            return
        output, text = called
        self._count("distillations")
        parsed = parse_distillation(text, len(shown), self.config.parse_limits)
        changes = self._changes(parsed.ops if parsed.ok else (), shown, request.env_id,
                                request.step, "distill", prompt, output, parsed.error)
        if changes:
            self.apply(changes)
            self._count("ops_applied", len(parsed.ops))

    def _merge(self, env_id: str, ids: list[str]) -> None:
        shown = [e for e in (self.bank.get(i) for i in ids) if e is not None]
        if len(shown) < 2:
            return
        prompt = self._merge_template.substitute(env_id=env_id, entries=_numbered(shown))
        called = self._call_extractor(prompt)
        if called is None:
            return
        output, text = called
        self._count("merges")
        parsed = parse_merge(text, len(shown), self.config.parse_limits)
        step = max(e.created_step for e in shown)
        changes = self._changes(parsed.ops if parsed.ok else (), shown, env_id, step, "merge",
                                prompt, output, parsed.error)
        if changes:
            self.apply(changes)
            self._count("ops_applied", len(parsed.ops))

    def _changes(self, ops: Sequence[Operation], shown: list[ExperienceEntry], env_id: str,
                 step: int, kind: str, prompt: str, output: Any,
                 error: str | None) -> list[BankChange]:
        """Bank changes for parsed operations; registers the generation for credit."""
        generation_id = uuid.uuid4().hex
        if error is not None:
            self._count("format_failures")
            log.info("extractor %s answer rejected: %s", kind, error)
            if self.config.format_failure_reward is not None:
                self.ledger.register(generation_id, prompt, output, kind,  # type: ignore[arg-type]
                                     fixed_reward=self.config.format_failure_reward)
            return []
        changes: list[BankChange] = []
        for op in ops:
            if isinstance(op, (Update, Merge)):
                changes.append(DeleteEntries(tuple(shown[t].id for t in op.targets)))
            elif isinstance(op, (Rewrite, Discard)):
                changes.append(DeleteEntries((shown[op.target].id,)))
            elif isinstance(op, Vote):
                changes.append(VoteEntry(shown[op.target].id, op.delta))
            if isinstance(op, (Add, Update, Merge, Rewrite)):
                changes.append(AddEntry(env_id, op.title, op.content, generation_id, step))
        if any(isinstance(c, AddEntry) for c in changes):
            self.ledger.register(generation_id, prompt, output, kind)  # type: ignore[arg-type]
        return changes

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
            with self._rw.read():
                now = time.time()
                for query, found in zip(queries, hits, strict=True):
                    live = [(e, s) for e, s in ((self.bank.get(i), s) for i, s in found) if e]
                    chosen = diversity_rerank(live, query.k, cfg, now, self._rng)
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

    def _count(self, name: str, n: int = 1) -> None:
        with self._counters_lock:
            self._counters[name] += n
