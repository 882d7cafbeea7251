"""Experience for Complementary RL: the bank, retrieval, the extractor's operations and the
asynchronous Experience Manager (docs/method.md, "The experience bank" and "The Experience
Manager and its asynchronous loop").

- ``entries``: ``ExperienceEntry``, the bank's changes (``AddEntry``, ``DeleteEntries``,
  ``VoteEntry``), ``ApplyResult`` and ``clean_text``.
- ``bank_file``: the bank's SQLite file (layout, checks, writer lock) and ``BankError``.
- ``bank``: ``ExperienceBank`` (SQLite WAL, crash-safe, FIFO capacity, JSONL export/import);
  beside it ``bank_sqlite`` (its write transactions, tables and first read), ``bank_capacity``
  (the stored capacity and its rules) and ``bank_jsonl`` (the export format).
- ``retrieval``: BM25 (bm25s) and dense indexes, the diversity re-rank, ``RetrievalConfig``.
- ``operations``: the operation types and the strict parser of extractor answers.
- ``prompts``: the extractor's prompt templates (``assets/prompts/experience_*.txt``).
- ``client``: the two faces, ``ExperienceClient`` (retrieve, ask: the rollouts') and
  ``ExperienceOwner`` (the trainer's: flush, submit, merge, a step's credit, rewards, stats,
  checkpoints, the weights lock).
- ``credit``: ``CreditLedger``, ``GenerationReward`` (the extractor's reward by use),
  ``EpisodeOutcome`` and ``credit_episodes`` (a step's episodes credited, in one place).
- ``checkpoint``: a run's bank file, a checkpoint's bank and credit state, ``restore_bank``.
- ``gate``: the actor-critic gate's verdicts (accept / refine / reject) and their critic scores.
- ``ask``: search-and-ask, the actor's queries mid-episode and the extractor's answers.
- ``locks``: ``ReadWriteLock`` (retrievals share, bank writes exclude).
- ``track``: ``TrackState`` (the jobs and re-indexing a flush waits on) and ``Counters``.
- ``records``: ``LessonRecords``, the writers, endorsers and use records of entries.
- ``distill``: ``DistillationRequest``, ``distill_prompt`` and ``ExtractorJobs``, the
  extractor's job queue.
- ``search``: ``Retriever`` (an index per partition, coverage floor, re-rank; no thread),
  ``SearchBatcher`` (batched serving) and ``Indexer`` (background rebuilds).
- ``manager_config``: ``ManagerConfig``, every setting of the manager.
- ``manager``: ``ExperienceManager``, composing the objects above.
"""

from crl_harness.experience.ask import AskAnswer, AskRecord, parse_ask
from crl_harness.experience.bank import ExperienceBank
from crl_harness.experience.bank_file import BankError
from crl_harness.experience.client import ExperienceClient, ExperienceOwner
from crl_harness.experience.credit import (
    CreditLedger,
    EpisodeOutcome,
    GenerationReward,
    credit_episodes,
    entry_credit,
    episode_credit,
    free_baselines,
    gated_credit,
)
from crl_harness.experience.distill import DistillationRequest, distill_prompt, episodes_to_distill
from crl_harness.experience.entries import (
    AddEntry,
    ApplyResult,
    DeleteEntries,
    ExperienceEntry,
    VoteEntry,
)
from crl_harness.experience.gate import CRITIC_SCORES, GateVerdict, parse_verdict
from crl_harness.experience.locks import ReadWriteLock
from crl_harness.experience.manager import ExperienceManager
from crl_harness.experience.manager_config import ManagerConfig
from crl_harness.experience.operations import (
    ParseLimits,
    ParseResult,
    parse_distillation,
    parse_merge,
)
from crl_harness.experience.prompts import load_prompt
from crl_harness.experience.retrieval import RetrievalConfig, diversity_rerank, tokenize

__all__ = [
    "AddEntry", "ApplyResult", "BankError", "DeleteEntries", "ExperienceBank", "ExperienceEntry",
    "VoteEntry", "ExperienceClient", "ExperienceOwner", "CreditLedger", "GenerationReward",
    "EpisodeOutcome",
    "episode_credit", "gated_credit", "entry_credit", "free_baselines", "credit_episodes",
    "AskAnswer", "AskRecord", "parse_ask", "CRITIC_SCORES", "GateVerdict", "parse_verdict",
    "DistillationRequest", "ExperienceManager", "ManagerConfig", "ReadWriteLock",
    "distill_prompt", "episodes_to_distill",
    "ParseLimits", "ParseResult", "parse_distillation", "parse_merge",
    "load_prompt", "RetrievalConfig", "diversity_rerank", "tokenize",
]
