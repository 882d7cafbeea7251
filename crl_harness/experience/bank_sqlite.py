"""The experience bank's SQL around its entries: write transactions, the tables, the first read.

Holds:
- ``transaction``: one write transaction on a bank's connection, rolled back on an error unless
  SQLite already ended it, SQLite's errors said as what happened (``bank_file._bank_error``);
- ``create_tables``: the writer's schema and format row (``bank_file._SCHEMA``, ``_FORMAT``);
- ``read_entries``: every entry of a bank, oldest first, as the bank's mirror is filled.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from crl_harness.experience.bank_file import _COLUMNS, _FORMAT, _SCHEMA, _bank_error
from crl_harness.experience.entries import ExperienceEntry

__all__ = ["transaction", "create_tables", "read_entries"]


@contextmanager
def transaction(db: sqlite3.Connection, path: str) -> Iterator[None]:
    """One write transaction. On an error it is rolled back unless SQLite already did (a
    full disk ends it: a second ROLLBACK would raise "no transaction is active" and hide
    why), and SQLite's errors become ones that say what happened (``_bank_error``)."""
    try:
        db.execute("BEGIN IMMEDIATE")
        yield
        db.execute("COMMIT")
    except BaseException as err:
        if db.in_transaction:
            db.execute("ROLLBACK")
        if isinstance(err, sqlite3.DatabaseError):
            raise _bank_error(Path(path), err) from err
        raise


def create_tables(db: sqlite3.Connection, path: str) -> None:
    """Make the bank's tables where they are missing and record its format, in one transaction."""
    with transaction(db, path):
        for statement in filter(str.strip, _SCHEMA.split(";")):
            db.execute(statement)
        db.execute("INSERT OR IGNORE INTO bank_meta (key, value) VALUES ('format', ?)",
                   (_FORMAT,))


def read_entries(db: sqlite3.Connection, path: str) -> Iterator[ExperienceEntry]:
    """Every entry of the bank, oldest first; a damaged file is a ``BankError``."""
    try:
        rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM entries ORDER BY seq")
        for row in rows:
            yield ExperienceEntry(*row)
    except sqlite3.DatabaseError as err:  # "database disk image is malformed"
        raise _bank_error(Path(path), err) from err
