"""The capacity stored with an experience bank, and the rule that picks the one it runs at.

Holds:
- ``DEFAULT_CAPACITY``: a new bank's (and one from before the capacity was stored);
- ``stored_capacity`` / ``store_capacity``: the capacity kept in the bank's ``bank_meta`` table;
- ``resolve_capacity``: the capacity to run at, never one that silently evicts what the bank
  holds (``BankError`` names the capacity that would keep it).
"""

from __future__ import annotations

import sqlite3

from crl_harness.experience.bank_file import BankError
from crl_harness.experience.bank_sqlite import transaction

__all__ = ["DEFAULT_CAPACITY", "stored_capacity", "store_capacity", "resolve_capacity"]

DEFAULT_CAPACITY = 20_000


def stored_capacity(db: sqlite3.Connection) -> int | None:
    """The capacity stored in the bank; ``None`` for a bank from before it was stored."""
    try:
        row = db.execute("SELECT value FROM bank_meta WHERE key = 'capacity'").fetchone()
    except sqlite3.OperationalError:  # read-only view of a bank from before bank_meta
        return None
    return int(row[0]) if row else None


def store_capacity(db: sqlite3.Connection, path: str, capacity: int) -> None:
    """Keep ``capacity`` in the bank at ``path`` (one transaction)."""
    with transaction(db, path):
        db.execute("INSERT OR REPLACE INTO bank_meta (key, value) VALUES "
                   "('capacity', ?)", (str(capacity),))


def resolve_capacity(asked: int | None, stored: int | None, count: int, path: str, *,
                     evict: bool, read_only: bool) -> int:
    """The capacity to run the bank at ``path`` (holding ``count`` entries) at: never one that
    silently evicts what the bank holds.

    Example:
        >>> resolve_capacity(None, 500, 10, "bank.sqlite", evict=False, read_only=False)
        500
        >>> resolve_capacity(100, 500, 10, "bank.sqlite", evict=True, read_only=False)
        100
    """
    if asked is None:
        return stored if stored is not None else max(DEFAULT_CAPACITY, count)
    floor = stored if stored is not None else count
    if asked < floor and not evict:
        held = f"was built with capacity {stored}" if stored is not None \
            else f"holds {count} entries"
        raise BankError(
            f"The experience bank {path} {held}; opening it with capacity {asked} "
            f"would evict entries. Use a capacity of at least {floor} (e.g. "
            f"experience.capacity={floor}), or ExperienceBank(..., capacity={asked}, "
            "evict=True) to drop the oldest entries on purpose.")
    if read_only and asked < count:
        raise BankError(f"A read-only bank cannot shrink: {path} holds "
                        f"{count} entries, more than capacity {asked}.")
    return asked
