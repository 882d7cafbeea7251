"""The extractor's jobs on the Experience Manager's background track: distilling finished episodes
and merge passes (docs/method.md, "The Experience Manager and its asynchronous loop").

Holds:
- ``DistillationRequest``: one finished episode sent for distillation.
- ``Extractor``: what answers the jobs (any callable ``prompt -> str`` or an object with ``.text``).
- ``distill_prompt``: the extractor's prompt for one finished episode and the entries it was
  shown (the manager's, and the warm start's extractor samples); ``numbered_entries``, the entries as
  every extractor prompt shows them (distillation, merge, search-and-ask).
- ``ExtractorJobs``: the extractor's job queue, composed by ``ExperienceManager``:
  ``max_concurrent_extractions`` threads call the extractor, parse its answer strictly and apply
  the operations through the manager (distillations, and merge passes over chunks of
  ``merge_chunk`` entries); a generation whose entries were written is registered for credit.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any

from crl_harness.experience.bank import ExperienceBank
from crl_harness.experience.bank_file import BankError
from crl_harness.experience.credit import CreditLedger
from crl_harness.experience.entries import (
    AddEntry,
    BankChange,
    DeleteEntries,
    ExperienceEntry,
    VoteEntry,
    same_text,
)
from crl_harness.experience.manager_config import ManagerConfig
from crl_harness.experience.operations import (
    Add,
    Discard,
    Merge,
    Operation,
    Rewrite,
    Update,
    Vote,
    parse_distillation,
    parse_merge,
)
from crl_harness.experience.prompts import load_prompt
from crl_harness.experience.track import Counters, TrackState

__all__ = ["DistillationRequest", "Extractor", "ExtractorJobs", "distill_prompt",
           "numbered_entries", "judgment_reward", "episodes_to_distill"]

log = logging.getLogger(__name__)

Extractor = Callable[[str], Any]


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
    query: str = ""
    """what the episode retrieved with (its level's key): a vote on an entry of another key
    is not counted (``Retriever.is_own``)"""


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


def numbered_entries(entries: Sequence[ExperienceEntry]) -> str:
    """``entries`` as every extractor prompt shows them, numbered from 0."""
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
        retrieved=numbered_entries(shown), max_ops=max_ops,
        transcript=_clip(request.transcript, max_transcript_chars))


def episodes_to_distill(episodes: Sequence[Any], per_group: int) -> list[Any]:
    """The finished episodes of a step worth distilling, at most ``per_group`` a group (the cap
    of extractor calls: one per guided slot): every guided episode that was shown a lesson (its
    verdict is what keeps or drops that lesson), then the group's won episode with the fewest
    moves, free or guided (the route worth writing: free winners are half the wins), or, in a
    group that won nothing, one lost episode (``return`` is the answer to learn there).

    >>> from types import SimpleNamespace as E
    >>> def ep(name, guided, won, steps, ids=()):
    ...     return E(name=name, group_id=0, use_experience=guided, won=won, steps=steps,
    ...              experience_ids=list(ids))
    >>> step = [ep("g0", True, False, 6, ["e"]), ep("g1", True, True, 4), ep("f0", False, True, 2),
    ...         ep("f1", False, False, 6)]
    >>> [e.name for e in episodes_to_distill(step, per_group=2)]
    ['g0', 'f0']
    """
    groups: dict[Any, list[Any]] = {}
    for episode in episodes:
        groups.setdefault(episode.group_id, []).append(episode)
    chosen: list[Any] = []
    for group in groups.values():
        picked = [e for e in group if e.use_experience and e.experience_ids]
        won = sorted((e for e in group if e.won), key=lambda e: e.steps)
        extra = won[:1] or [e for e in group if e.use_experience and not e.experience_ids][:1] \
            or group[:1]
        picked += [e for e in extra if all(e is not p for p in picked)]
        chosen += picked[:per_group]
    return chosen


def judgment_reward(ops: Sequence[Operation], won: bool) -> float:
    """The reward of a distillation that wrote nothing, by the outcome of the episode it judged:
    +1 where each verdict agrees with it (an upvote of a won episode's lesson, a downvote of a
    lost one's, ``return`` after a loss), -1 where it contradicts it (the mean over votes).

    >>> judgment_reward([Vote(0, 1)], won=True), judgment_reward([], won=True)
    (1.0, -1.0)
    >>> judgment_reward([Vote(0, -1)], won=True), judgment_reward([], won=False)
    (-1.0, 1.0)
    """
    verdicts = [op.delta > 0 for op in ops if isinstance(op, Vote)] or [False]
    return sum(1.0 if up == won else -1.0 for up in verdicts) / len(verdicts)


def restated(ops: Sequence[Operation], shown: Sequence[ExperienceEntry],
             own: Sequence[bool]) -> dict[int, int]:
    """The adds of ``ops`` that restate an entry shown to the episode, of its own level (same
    text, case and whitespace aside), by their place in ``ops``: that entry's number. The manager
    folds such an add into the entry as an upvote (``ExperienceManager.apply``), so it is judged
    as one.

    >>> shown = [ExperienceEntry("e", "env", "Winning moves", "play south.")]
    >>> restated([Add("winning moves", "play  South."), Add("Winning moves", "play west.")],
    ...          shown, [True])
    {0: 0}
    >>> restated([Add("Winning moves", "play south.")], shown, [False])
    {}
    """
    texts = {same_text(e.title, e.content): t for t, e in enumerate(shown) if own[t]}
    return {i: t for i, op in enumerate(ops)
            if isinstance(op, Add) and (t := texts.get(same_text(op.title, op.content))) is not None}


class ExtractorJobs:
    """The extractor's queue of distillations and merges and the threads that run them.

    Its inputs: the ``bank`` it reads the shown entries from; ``config``'s prompt limits,
    ``merge_chunk``, thread count and format penalty; the ``ledger`` its generations are
    registered in; the ``track`` that counts its pending jobs; ``counters``; ``apply``, which
    writes a job's bank changes (the manager's, under its write lock); ``is_own``, whether an
    entry shown to an episode is its level's (a vote on another's is not counted); and the
    ``extractor`` (``set_extractor`` replaces it). ``start`` starts the threads.
    """

    def __init__(self, bank: ExperienceBank, config: ManagerConfig, ledger: CreditLedger,
                 track: TrackState, counters: Counters,
                 apply: Callable[[Sequence[BankChange]], Any],
                 is_own: Callable[[str, str, ExperienceEntry], bool],
                 extractor: Extractor | None = None) -> None:
        self._bank = bank
        self._config = config
        self._ledger = ledger
        self._track = track
        self._counters = counters
        self._apply = apply
        self._is_own = is_own
        self.extractor = extractor
        self._distill_template = load_prompt("experience_distill")
        self._merge_template = load_prompt("experience_merge")
        self._jobs: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._extract_loop, daemon=True,
                                          name=f"experience-extract-{i}")
                         for i in range(config.experience.max_concurrent_extractions)]

    def start(self) -> None:
        """Start the extractor threads."""
        for thread in self._threads:
            thread.start()

    def distill(self, request: DistillationRequest) -> None:
        """Queue ``request`` (returns at once)."""
        self._enqueue(("distill", request))

    def merge(self, env_id: str, entry_ids: list[str]) -> None:
        """Queue a merge of these entries of ``env_id`` (returns at once)."""
        self._enqueue(("merge", env_id, entry_ids))

    def stop(self, drop_queued: bool) -> None:
        """Stop the threads once the jobs queued before are done (or, with ``drop_queued``,
        dropped); call after ``track`` is closed."""
        if drop_queued:
            while True:
                try:
                    self._jobs.get_nowait()
                except queue.Empty:
                    break
                self._track.job_done()
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()

    def call(self, prompt: str) -> tuple[Any, Any] | None:
        """The extractor's output for ``prompt`` and its text; None (counted) if it raised."""
        extractor = self.extractor
        if extractor is None:
            raise RuntimeError("ExperienceManager has no extractor; call set_extractor first.")
        try:
            output = extractor(prompt)
        except Exception:
            log.exception("the extractor raised; the job applies nothing")
            self._counters.add("extractor_errors")
            return None
        return output, (output if isinstance(output, str) else getattr(output, "text", output))

    def _enqueue(self, job: tuple) -> None:
        self._track.job_queued()
        self._jobs.put(job)

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
                self._counters.add("job_errors")
            except Exception:  # a bug in one job must not stop the background track
                log.exception("experience job %s failed", job[0])
                self._counters.add("job_errors")
            finally:
                self._track.job_done()

    def _distill(self, request: DistillationRequest) -> None:
        shown = [e for e in (self._bank.get(i) for i in request.retrieved_ids) if e is not None]
        prompt = distill_prompt(request, shown, max_ops=self._config.parse_limits.max_ops,
                                max_transcript_chars=self._config.experience.max_transcript_chars,
                                template=self._distill_template)
        called = self.call(prompt)
        if called is None:
            return
        output, text = called
        self._counters.add("distillations")
        parsed = parse_distillation(text, len(shown), self._config.parse_limits)
        ops = parsed.ops if parsed.ok else ()
        own = [self._is_own(request.env_id, request.query, e) for e in shown]
        counted = tuple(op for op in ops if not isinstance(op, Vote) or own[op.target])
        self._counters.add("votes_ignored", len(ops) - len(counted))
        changes = self._changes(counted, shown, request.env_id, request.step, "distill", prompt,
                                output, parsed.error,
                                judged=request.won if parsed.ok and counted == ops else None,
                                own=own)
        if changes:
            self._apply(changes)
            self._counters.add("ops_applied", len(counted))

    def _merge(self, env_id: str, ids: list[str]) -> None:
        shown = [e for e in (self._bank.get(i) for i in ids) if e is not None]
        if len(shown) < 2:
            return
        prompt = self._merge_template.substitute(env_id=env_id, entries=numbered_entries(shown))
        called = self.call(prompt)
        if called is None:
            return
        output, text = called
        self._counters.add("merges")
        parsed = parse_merge(text, len(shown), self._config.parse_limits)
        step = max(e.created_step for e in shown)
        changes = self._changes(parsed.ops if parsed.ok else (), shown, env_id, step, "merge",
                                prompt, output, parsed.error)
        if changes:
            self._apply(changes)
            self._counters.add("ops_applied", len(parsed.ops))

    def _changes(self, ops: Sequence[Operation], shown: list[ExperienceEntry], env_id: str,
                 step: int, kind: str, prompt: str, output: Any,
                 error: str | None, judged: bool | None = None,
                 own: Sequence[bool] = ()) -> list[BankChange]:
        """Bank changes for parsed operations; registers the generation for credit: one that
        writes (or endorses) an entry is credited when the entry is used; a distillation that
        only judged (votes, ``return``, or adds that restate the level's own entry it was shown:
        ``restated``) of an episode whose outcome is ``judged`` (won) at once, by that outcome
        (``judgment_reward``). A restatement is an upvote: as an endorser's it waited for a later
        use of the entry, which the level's last visit (most of a run's restatements) never
        brings."""
        generation_id = uuid.uuid4().hex
        if error is not None:
            self._counters.add("format_failures")
            log.info("extractor %s answer rejected: %s", kind, error)
            if self._config.format_penalty is not None:
                self._ledger.register(generation_id, prompt, output, kind,  # type: ignore[arg-type]
                                      fixed_reward=self._config.format_penalty)
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
        upvotes = restated(ops, shown, own) if own else {}
        writes = any(isinstance(op, (Add, Update, Merge, Rewrite)) and i not in upvotes
                     for i, op in enumerate(ops))
        if writes or (upvotes and judged is None):
            self._ledger.register(generation_id, prompt, output, kind)  # type: ignore[arg-type]
        elif judged is not None:
            self._counters.add("judgments")
            verdicts = [Vote(upvotes[i], 1) if i in upvotes else op for i, op in enumerate(ops)]
            self._ledger.register(generation_id, prompt, output, kind,  # type: ignore[arg-type]
                                  fixed_reward=judgment_reward(verdicts, judged))
        return changes
