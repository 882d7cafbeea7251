"""The experience bank's SQLite file: its layout, opening it safely and what its errors say.

Holds:
- The file's layout: ``_SCHEMA``, ``_FORMAT`` (written into ``bank_meta``), ``_BANK_TABLES``,
  ``_COLUMNS`` and ``_row`` (an entry's column values).
- ``BankError``: a file that is not a bank, a second writer, or a capacity that would evict.
- ``_check_is_bank``: is this file a bank (or new)? Read through a read-only connection, so a
  foreign file is left untouched.
- ``_read_only_uri``: the URI that opens a bank read-only (immutable where no ``-shm`` can be made).
- ``_bank_error``: SQLite's and the OS's errors as ones that say what happened.
- ``writer_lock``: the lock file beside a bank that refuses a second writing process.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from crl_envs.errors import UserFacingError
from crl_harness.experience.entries import ExperienceEntry

__all__ = ["BankError", "writer_lock"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    env_id TEXT NOT NULL,
    title TEXT NOT NULL,
    content TEXT NOT NULL,
    generation_id TEXT,
    created_step INTEGER NOT NULL,
    created_at REAL NOT NULL,
    retrieval_count INTEGER NOT NULL DEFAULT 0,
    last_retrieved_at REAL,
    votes INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS entries_env ON entries (env_id, seq);
CREATE TABLE IF NOT EXISTS bank_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Written into bank_meta; a bank from before it (no bank_meta table) still opens.
_FORMAT = "crl-experience-bank/1"
# The tables a bank file may hold; any other table means the file is something else.
_BANK_TABLES = {"entries", "bank_meta", "sqlite_sequence"}
_COLUMNS = (
    "id", "env_id", "title", "content", "generation_id", "created_step", "created_at",
    "retrieval_count", "last_retrieved_at", "votes",
)


class BankError(UserFacingError, ValueError):
    """The bank cannot be opened or written as asked; the message says what to do instead."""


def _row(entry: ExperienceEntry) -> tuple:
    """The entry's column values, in ``_COLUMNS`` order."""
    return tuple(getattr(entry, name) for name in _COLUMNS)


def _check_is_bank(path: Path, must_exist: bool) -> None:
    """Raise ``BankError`` unless ``path`` is an experience bank (or, when it need not exist, an
    empty file); reads through a read-only connection, so a foreign file is left as it was."""
    if not path.exists():
        if must_exist:
            raise BankError(f"No experience bank at {path}.")
        return
    not_a_bank = f"{path} is not an experience bank"
    try:
        probe = sqlite3.connect(_read_only_uri(path), uri=True)
    except sqlite3.Error as err:
        raise BankError(f"Cannot open {path} ({err}).") from err
    try:
        tables = {name for (name,) in probe.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        columns = {row[1] for row in probe.execute("PRAGMA table_info(entries)")}
        version = None
        if "bank_meta" in tables:
            row = probe.execute("SELECT value FROM bank_meta WHERE key = 'format'").fetchone()
            version = row[0] if row else None
    except sqlite3.DatabaseError as err:  # "file is not a database", unreadable
        raise BankError(f"{not_a_bank} ({err}).") from err
    finally:
        probe.close()
    if not tables and not must_exist:
        return  # an empty SQLite file: nothing to lose, it becomes a bank
    if "entries" not in tables or tables - _BANK_TABLES or not set(_COLUMNS) <= columns:
        raise BankError(f"{not_a_bank} (its tables are {sorted(tables) or 'none'}); it was "
                        "left untouched. Give the path of a bank.sqlite or a new file.")
    if version not in (None, _FORMAT):
        raise BankError(f"{path} is a bank of format {version!r}; this version reads {_FORMAT!r}.")


def _read_only_uri(path: Path) -> str:
    """The URI that opens ``path`` read-only. Reading a WAL bank needs its ``-shm`` file, which
    SQLite creates beside it: where the folder cannot be written (a read-only file system, a
    shipped bank, a colleague's run folder) and no writer has one open, the file is opened
    immutable, which needs none (and nothing can change it there)."""
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    if not Path(f"{path}-shm").exists() and not os.access(path.parent, os.W_OK):
        uri += "&immutable=1"
    return uri


def _bank_error(path: Path, err: OSError | sqlite3.DatabaseError) -> Exception:
    """What a failed read or write of the bank at ``path`` says: a full disk is an ``OSError``
    (ENOSPC: the commands' one line, status 1); a read-only file or folder and a damaged file
    are a ``BankError``; other errors stay as they are."""
    code = getattr(err, "sqlite_errorname", "") or ""
    if code == "SQLITE_FULL" or getattr(err, "errno", None) == errno.ENOSPC:
        return OSError(errno.ENOSPC, "No space left on device: the experience bank's last write "
                       "was rolled back (what it acknowledged before is kept); free some space",
                       str(path))
    if code.startswith("SQLITE_READONLY") or getattr(err, "errno", None) in (errno.EROFS,
                                                                             errno.EACCES):
        return BankError(f"Cannot write the experience bank {path}: read-only file system or "
                         "folder. Open it read-only (crl eval --experience does), or copy it to "
                         "a folder you can write.")
    if code in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        return BankError(f"The experience bank {path} is damaged ({err}); restore it from a copy "
                         "or a checkpoint's bank.jsonl.")
    return err


def writer_lock(path: Path):
    """An exclusive lock on ``PATH.lock``, held while this bank is open for writing: each writer
    mirrors the bank in memory, so a second one would evict, vote and delete blind."""
    lock_path = Path(f"{path}.lock")
    handle = open(lock_path, "a+")  # noqa: SIM115 - held open for the bank's life
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        handle.close()
        raise BankError(
            f"The experience bank {path} is open for writing in another process (or another "
            "ExperienceBank here). Close that one first, or open it with read_only=True "
            "(crl eval --experience does).") from err
    return handle
