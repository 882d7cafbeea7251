"""The experience bank's records and the changes it applies.

Holds:
- ``ExperienceEntry``: one entry (title + content) of one env partition, with its bookkeeping.
- ``AddEntry``, ``DeleteEntries``, ``VoteEntry`` (``BankChange``): the primitive changes;
  ``ExperienceBank.apply`` runs a list of them as ONE transaction (the paper's refine is a
  delete plus an add).
- ``ApplyResult``: what a transaction added, deleted and evicted.
- ``clean_text``: text made valid Unicode (lone surrogates become U+FFFD), as the bank stores it;
  ``_cleaned``: an imported entry with its text fields cleaned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

__all__ = [
    "ExperienceEntry",
    "AddEntry",
    "DeleteEntries",
    "VoteEntry",
    "BankChange",
    "ApplyResult",
    "clean_text",
    "same_text",
]


@dataclass(frozen=True)
class ExperienceEntry:
    """One piece of distilled experience, in the partition of one env.

    ``generation_id`` is the extractor output that wrote it (credit goes there when it is used).

    Example:
        >>> entry = ExperienceEntry("e1", "CRL/Sokoban-v0", "Corners", "Never push a box into a corner.")
        >>> entry.text
        'Corners: Never push a box into a corner.'
    """

    id: str
    env_id: str
    title: str
    content: str
    generation_id: str | None = None
    created_step: int = 0
    created_at: float = 0.0
    retrieval_count: int = 0
    last_retrieved_at: float | None = None
    votes: int = 0

    @property
    def text(self) -> str:
        """The entry as the actor reads it."""
        return f"{self.title}: {self.content}"


@dataclass(frozen=True)
class AddEntry:
    """Add a new entry to ``env_id``'s partition."""

    env_id: str
    title: str
    content: str
    generation_id: str | None = None
    step: int = 0


@dataclass(frozen=True)
class DeleteEntries:
    """Delete entries by id (ids already gone are skipped)."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class VoteEntry:
    """Add ``delta`` to an entry's votes; an entry whose votes go negative is deleted."""

    id: str
    delta: int


BankChange = AddEntry | DeleteEntries | VoteEntry


@dataclass
class ApplyResult:
    """What one ``apply`` transaction did (``added`` also lists entries that the same
    transaction evicted again, which ``evicted`` lists too)."""

    added: list[ExperienceEntry] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    envs: set[str] = field(default_factory=set)  # partitions whose content changed


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """``text`` as valid Unicode: a surrogate pair becomes its character, a lone surrogate
    (a model's broken output, a JSON escape) U+FFFD, so SQLite and UTF-8 files accept it.

    Example:
        >>> clean_text("ok " + chr(0xD800)) == "ok " + chr(0xFFFD)
        True
        >>> clean_text(chr(0xD83D) + chr(0xDE00)) == chr(0x1F600)
        True
    """
    if not isinstance(text, str):
        raise TypeError(f"Entry text must be str, got {type(text).__name__}.")
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


_SPACES = re.compile(r"\s+")


def same_text(title: str, content: str) -> str:
    """An entry's text as two entries that say the same thing share it: case and runs of
    whitespace aside.

    >>> same_text("Winning moves", "play  South.") == same_text("winning moves", "play south.")
    True
    """
    return _SPACES.sub(" ", f"{title}: {content}").strip().lower()


def _cleaned(entry: ExperienceEntry) -> ExperienceEntry:
    """An imported entry with its text fields made valid Unicode."""
    return replace(entry, id=clean_text(entry.id), env_id=clean_text(entry.env_id),
                   title=clean_text(entry.title), content=clean_text(entry.content),
                   generation_id=None if entry.generation_id is None
                   else clean_text(entry.generation_id))
