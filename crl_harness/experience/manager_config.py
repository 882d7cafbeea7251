"""The Experience Manager's settings: ``ManagerConfig`` (its own module, so that the manager's
parts, ``search`` and ``distill``, read it without importing the manager)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from crl_harness.config.fields import check_settings
from crl_harness.config.schema import ExperienceConfig, ExtractorConfig
from crl_harness.experience.operations import ParseLimits
from crl_harness.experience.retrieval import RetrievalConfig

__all__ = ["ManagerConfig"]


@dataclass(frozen=True)
class ManagerConfig:
    """Settings of the Experience Manager (defaults: the released configuration, but for the
    retrieval batching: one batch per burst of a 64-episode rollout batch, scored by one
    search worker; ``benchmarks/experience_bench.py`` measures the burst). Those a training run
    sets are its ``experience`` section's, which ``retrieval`` holds (the manager reads its
    ``max_concurrent_extractions`` and ``max_transcript_chars``: ``experience``), and the
    extractor's ``format_penalty``; ``from_config`` builds it from them.

    >>> manager = ManagerConfig.from_config(ExperienceConfig(max_transcript_chars=500), seed=5)
    >>> manager.experience.max_transcript_chars, manager.retrieval.experience.candidates
    (500, 16)
    """

    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    """the retrieval settings, with the run's ``experience`` section"""
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
    parse_limits: ParseLimits = field(default_factory=ParseLimits)
    format_penalty: float | None = ExtractorConfig.format_penalty
    """``extractor.format_penalty``: the reward of a generation whose answer was malformed."""
    max_pending_generations: int = 10_000
    reindex_interval_s: float = 30.0
    """A changed partition is re-indexed at most this often, and at once while ``flush`` waits.
    A BM25 rebuild holds the GIL for ~60 ms per 1,000 entries, so rebuilding after every write
    slows rollouts in the same process; the harness flushes before each rollout phase anyway."""
    seed: int = 0

    @property
    def experience(self) -> ExperienceConfig:
        """The run's ``experience`` section (the one ``retrieval`` holds)."""
        return self.retrieval.experience

    @classmethod
    def from_config(cls, experience: ExperienceConfig, exact_key_envs: Sequence[str] = (),
                    **settings: Any) -> ManagerConfig:
        """The manager of a run's ``experience`` section; ``exact_key_envs``: the run's envs
        whose retrieval key is exact (``RetrievalConfig``); ``settings``: the manager's own
        (e.g. the ``seed`` and ``format_penalty`` of the run)."""
        return cls(retrieval=RetrievalConfig(experience, frozenset(exact_key_envs)), **settings)

    def __post_init__(self) -> None:
        check_settings(ExperienceConfig, "experience", {
            "max_concurrent_extractions": self.experience.max_concurrent_extractions,
            "max_transcript_chars": self.experience.max_transcript_chars})
        check_settings(ExtractorConfig, "extractor", {"format_penalty": self.format_penalty})
        for name in ("batch_size", "search_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"ManagerConfig.{name} must be at least 1.")
        if self.merge_chunk < 2:
            raise ValueError("ManagerConfig.merge_chunk must be at least 2.")
        for name in ("batch_wait_s", "batch_gap_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ManagerConfig.{name} must be a number of seconds >= 0.")
