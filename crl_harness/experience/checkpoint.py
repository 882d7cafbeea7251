"""The experience's files in a training run: its bank in the run folder, and what a checkpoint
keeps of it.

Holds ``BANK_FILE`` (a run's bank, ``run_dir/bank.sqlite``), ``BANK_EXPORT`` and ``CREDIT_FILE``
(a checkpoint's bank and credit state), ``export_experience`` and ``import_credit`` (a
checkpoint's, written and read back) and ``restore_bank`` (a run's bank replaced by a
checkpoint's, on ``--resume``).
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from crl_harness.experience.bank import ExperienceBank
from crl_harness.experience.bank_file import writer_lock
from crl_harness.experience.manager import ExperienceManager

__all__ = ["BANK_FILE", "BANK_EXPORT", "CREDIT_FILE", "export_experience", "import_credit",
           "restore_bank"]

BANK_FILE = "bank.sqlite"
BANK_EXPORT = "bank.jsonl"
CREDIT_FILE = "credit_ledger.pkl"


def export_experience(manager: ExperienceManager, directory: str | os.PathLike) -> int:
    """Flush ``manager``, then write its bank (JSONL) and its credit state (the generations
    awaiting credit, the entries' endorsers and records) to ``directory``; returns the number
    of entries."""
    directory = Path(directory)
    manager.flush()
    n = manager.bank.export_jsonl(directory / BANK_EXPORT)
    with open(directory / CREDIT_FILE, "wb") as handle:
        pickle.dump({"ledger": manager.ledger.export(), "records": manager.records.export()},
                    handle)
    return n


def import_credit(manager: ExperienceManager, directory: str | os.PathLike) -> None:
    """The credit state of a checkpoint (``export_experience``'s) into ``manager``, if the
    checkpoint has one."""
    path = Path(directory) / CREDIT_FILE
    if not path.exists():
        return
    with open(path, "rb") as handle:
        saved = pickle.load(handle)
    if isinstance(saved, dict):  # the ledger and the entries' records
        manager.ledger.load(saved["ledger"])
        manager.records.load(saved["records"])
    else:  # a checkpoint from before the records were kept: the ledger alone
        manager.ledger.load(saved)


def _remove_bank_files(path: Path) -> None:
    """A bank file with its WAL, shared memory and lock files."""
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def restore_bank(run_dir: str | os.PathLike, source: str | os.PathLike,
                 capacity: int | None = None) -> None:
    """Replace ``run_dir``'s bank by the entries of ``source`` (a checkpoint folder, whose
    ``bank.jsonl`` is read, or such a file), before the run opens it: on ``--resume``, what the
    extractor wrote after the checkpoint is undone, as the steps are re-run.

    The new bank is built beside the old one and renamed over it only once complete, under the
    old bank's writer lock: a bank open in a live run refuses (``BankError``) and a failure
    (e.g. ``capacity``, the run's ``experience.capacity``, smaller than the export: a resume
    never drops what a checkpoint saved) leaves the old bank as it was."""
    run_dir, source = Path(run_dir), Path(source)
    export = source / BANK_EXPORT if source.is_dir() else source
    bank_path = run_dir / BANK_FILE
    staged = run_dir / f".{BANK_FILE}.restoring"
    run_dir.mkdir(parents=True, exist_ok=True)
    with writer_lock(bank_path):
        _remove_bank_files(staged)
        try:
            bank = ExperienceBank(staged, capacity=capacity)
            try:
                if export.exists():
                    bank.import_jsonl(export, evict=False)
            finally:
                bank.close()
            # the old bank's WAL would be replayed into the new file: it goes first
            for suffix in ("-wal", "-shm"):
                Path(f"{bank_path}{suffix}").unlink(missing_ok=True)
            os.replace(staged, bank_path)
        finally:
            _remove_bank_files(staged)
