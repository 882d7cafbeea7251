"""The Experience Manager: the background track that owns the bank (docs/method.md, "The Experience
Manager and its asynchronous loop").

Holds:
- ``ExperienceManager``, the ``ExperienceClient`` of one process (``client``), which composes
  real objects, each built from its own inputs: a ``ReadWriteLock`` (``locks``), the
  ``LessonRecords`` (``records``), a ``Retriever``, its ``SearchBatcher`` and ``Indexer``
  (``search``), the ``ExtractorJobs`` (``distill``) and the ``TrackState`` they share
  (``track``):
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

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from crl_harness.experience.ask import NO_KNOWLEDGE, AskAnswer, answer_prompt, parse_answer_text
from crl_harness.experience.bank import ExperienceBank
from crl_harness.experience.credit import CreditLedger, GenerationReward
from crl_harness.experience.distill import (
    DistillationRequest,
    Extractor,
    ExtractorJobs,
    distill_prompt,
    numbered_entries,
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
from crl_harness.experience.records import LessonRecords
from crl_harness.experience.search import Indexer, Retriever, SearchBatcher
from crl_harness.experience.track import Counters, TrackState

__all__ = ["ReadWriteLock", "DistillationRequest", "ManagerConfig", "ExperienceManager",
           "Extractor", "distill_prompt"]

COUNTERS = ("submitted", "distillations", "merges", "format_failures", "extractor_errors",
            "job_errors", "ops_applied", "retrievals", "retrieval_batches", "outcomes_reported",
            "index_rebuilds", "index_errors", "asks", "ask_format_failures", "endorsements",
            "misses_uncredited", "votes_ignored", "judgments")


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
                 config: ManagerConfig | None = None) -> None:
        config = config if config is not None else ManagerConfig()
        self.bank = bank
        self.config = config
        self.ledger = CreditLedger(config.max_pending_generations)
        self.records = LessonRecords(remembered=4 * bank.capacity)
        self._counters = Counters(COUNTERS)
        self._track = TrackState()
        self._rw = ReadWriteLock()
        # Each live entry's text as a repeat would write it (``same_text``), kept with the bank
        # under the write lock, so an add finds the entry it repeats without reading the bank.
        self._by_text: dict[tuple[str, str], str] = {}
        self._text_of: dict[str, tuple[str, str]] = {}
        self._index_texts(bank.entries())
        self.retriever = Retriever(bank, config.retrieval, self._rw, self.records, self._counters,
                                   seed=config.seed)
        self._batcher = SearchBatcher(self.retriever, config)
        self._indexer = Indexer(self.retriever, self._track, config.reindex_interval_s,
                                self._counters)
        self.jobs = ExtractorJobs(bank, config, self.ledger, self._track, self._counters,
                                  self.apply, self.retriever.is_own, extractor)
        self._indexer.rebuild(bank.env_ids())
        self.jobs.start()
        self._batcher.start()
        self._indexer.start()

    # ----------------------------------------------------------------- ExperienceClient
    def retrieve(self, env_id: str, query: str, k: int = 1) -> list[ExperienceEntry]:
        """Top-``k`` entries of ``env_id``'s partition for ``query`` (batched, shared lock)."""
        if not isinstance(env_id, str) or not isinstance(query, str):
            raise TypeError("retrieve(env_id, query, k) takes two strings and an int.")
        if k <= 0:
            return []
        if self._track.closed:
            raise RuntimeError("ExperienceManager is closed; create a new one to retrieve.")
        return self._batcher.retrieve(env_id, query, k)

    def report_outcome(self, entry_ids: Sequence[str], score: float,
                       critic: float | None = None, baseline: float | None = None,
                       env_id: str = "", query: str = "") -> None:
        """An episode that retrieved ``entry_ids`` ended with ``score``: credit their writers
        and endorsers (by the actor-critic gate's ``critic`` score when the gate judged the
        entries; relative to ``baseline``, its group's free mean score, when given:
        ``entry_credit``). Where ``env_id``'s key is exact, an entry of another level's key
        (a retrieval miss, ``query`` being the episode's) credits nobody and records nothing;
        one of its own records the win or loss (``LessonRecords.record_of``)."""
        used: list[tuple[str, ExperienceEntry | None]] = []
        for entry_id in entry_ids:
            entry = self.bank.get(entry_id)
            if entry is not None and not self.retriever.is_own(env_id, query, entry):
                self._counters.add("misses_uncredited")
                continue
            used.append((entry_id, entry))
        keyed = self.config.retrieval.keyed(env_id)
        generations = self.records.credited(used, won=score >= 1.0 if keyed else None)
        self.ledger.credit(generations, score, critic, baseline)
        self._counters.add("outcomes_reported")

    # ----------------------------------------------------------------- search-and-ask
    def ask(self, env_id: str, query: str, k: int = 1) -> AskAnswer:
        """Answer an actor's query mid-episode: retrieve ``k`` entries of ``env_id``'s partition
        for it and let the extractor write the answer (registered for credit, kind ``ask``).

        Nothing found: ``NO_KNOWLEDGE`` and no generation. A malformed extractor answer shows
        the entries themselves (it is trained only with a format penalty, like a malformed
        distillation); an extractor that raises answers ``NO_KNOWLEDGE``.
        """
        self._counters.add("asks")
        found = self.retrieve(env_id, query, k)
        if not found:
            return AskAnswer(NO_KNOWLEDGE)
        prompt = answer_prompt(env_id, query, numbered_entries(found))
        called = self.jobs.call(prompt)
        if called is None:
            return AskAnswer(NO_KNOWLEDGE)
        output, text = called
        generation_id = uuid.uuid4().hex
        answer = parse_answer_text(text)
        if answer is None:
            self._counters.add("ask_format_failures")
            if self.config.format_penalty is not None:
                self.ledger.register(generation_id, prompt, output, "ask",
                                     fixed_reward=self.config.format_penalty)
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
        self.jobs.distill(request)
        self._counters.add("submitted")

    def merge_pass(self, env_id: str | None = None, max_chunks: int | None = None) -> int:
        """Queue a merge pass over ``env_id``'s partition (every partition when None), in chunks
        of ``merge_chunk`` entries ordered by title, oldest first within a title (lessons of one
        retrieval key share their title: they meet in one chunk, where a merge can fold them);
        returns the number of chunks queued."""
        queued = 0
        for env in ([env_id] if env_id is not None else self.bank.env_ids()):
            ids = [entry.id for entry in sorted(self.bank.entries(env), key=lambda e: e.title)]
            size = self.config.merge_chunk
            for start in range(0, len(ids), size):
                chunk = ids[start:start + size]
                if len(chunk) < 2 or (max_chunks is not None and queued >= max_chunks):
                    continue
                self.jobs.merge(env, chunk)
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
            self.records.endorse(endorsed, self.bank)
            gone = result.deleted + result.evicted
            self.records.forget(gone)
            for entry_id in gone:
                key = self._text_of.pop(entry_id, None)
                if key is not None and self._by_text.get(key) == entry_id:
                    del self._by_text[key]
            self._index_texts(e for e in result.added if e.id in self.bank)
        if endorsed:
            self._counters.add("endorsements", len(endorsed))
        if result.envs:
            self._track.mark_dirty(result.envs)
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
        if not self._track.wait_idle(timeout):
            return False
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
        self.jobs.extractor = extractor

    def stats(self) -> dict[str, Any]:
        """Counters of the manager and the bank."""
        out: dict[str, Any] = self._counters.snapshot()
        out["pending"], out["index_dirty"] = self._track.backlog()
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
        if self._track.closed:
            return
        try:
            if flush:
                self.flush(timeout)  # may raise (a full disk): the threads are stopped anyway
        finally:
            self._stop_threads(drop_queued=not flush)
        self.bank.sync_retrieval_stats()

    def _stop_threads(self, drop_queued: bool) -> None:
        self._track.close()
        self.jobs.stop(drop_queued)  # before the indexer: its last jobs' writes get indexed
        self._batcher.stop()
        self._indexer.join()

    def __enter__(self) -> ExperienceManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
