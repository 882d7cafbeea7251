"""The results file of per-task attempts: what ``crl eval`` writes and ``crl swe filter`` reads.

Format (``crl-results/1``): JSON Lines, one attempt (one finished episode) per line, appended
as soon as the episode ends, so a crash loses at most the episode in flight::

    {"task_id": "django__django-11099", "won": true, "reward": 1.0, "score": 1.0,
     "steps": 17, "seed": 3, "env_id": "CRL/SWEBench-v0", "model": "Qwen/Qwen2.5-7B"}

Required keys: ``task_id`` (the env's task, e.g. an SWE-bench ``instance_id``) and ``won``
(success as the env's ``info["won"]`` says). Optional: ``reward``, ``score``, ``steps``,
``seed``, ``env_id``, ``model``; any other key is kept in ``extra``. A task's pass rate is its
successes over its attempts (pass@16 in the paper's filter is this rate over 16 attempts).

Holds ``Attempt``, ``TaskTally``, ``append_attempt``, ``read_attempts``, ``tally``.

Example:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "results.jsonl")
    >>> for won in (True, False, False, False):
    ...     append_attempt(path, Attempt(task_id="a__b-1", won=won))
    >>> tally(read_attempts(path))["a__b-1"]
    TaskTally(attempts=4, successes=1)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "Attempt", "TaskTally", "ResultsFormatError", "append_attempt",
           "read_attempts", "tally"]

FORMAT = "crl-results/1"


class ResultsFormatError(ValueError):
    """A results file line is not an attempt record; the message names the line."""


@dataclass
class Attempt:
    """One finished episode of one task."""

    task_id: str
    won: bool
    reward: float = 0.0
    score: float = 0.0
    steps: int = 0
    seed: int | None = None
    env_id: str = ""
    model: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        record = asdict(self)
        extra = record.pop("extra")
        return json.dumps({**extra, **record}, ensure_ascii=False)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Attempt:
        known = {name for name in cls.__dataclass_fields__ if name != "extra"}
        missing = {"task_id", "won"} - set(record)
        if missing:
            raise ResultsFormatError(f"attempt record lacks {', '.join(sorted(missing))}")
        fields = {key: record[key] for key in known if key in record}
        if fields["won"] not in (True, False):  # also 1 and 0; never a string such as "false"
            raise ResultsFormatError(f"won must be true or false, got {fields['won']!r}")
        fields["won"] = bool(fields["won"])
        for key, wanted in _FIELD_TYPES.items():
            if key in fields and not _is(fields[key], wanted):
                raise ResultsFormatError(f"{key} must be {_TYPE_NAMES[wanted]}, got "
                                         f"{str(fields[key])[:40]!r}")
        for key in ("reward", "score"):
            if key in fields:
                fields[key] = float(fields[key])
        return cls(**fields, extra={k: v for k, v in record.items() if k not in known})


_FIELD_TYPES = {"task_id": str, "reward": float, "score": float, "steps": int, "seed": "seed",
                "env_id": str, "model": str}
"""what each field of an attempt record holds (``from_record`` checks it)"""
_TYPE_NAMES = {str: "a string", float: "a number", int: "a whole number >= 0",
               "seed": "a whole number or null"}


def _is(value: Any, wanted: type | str) -> bool:
    if isinstance(value, bool):  # a bool is an int to Python, never a count or a reward here
        return False
    if wanted is float:
        return isinstance(value, (int, float))
    if wanted is int:
        return isinstance(value, int) and value >= 0
    if wanted == "seed":
        return value is None or isinstance(value, int)
    return isinstance(value, wanted)  # type: ignore[arg-type]


@dataclass
class TaskTally:
    """Attempts and successes of one task."""

    attempts: int = 0
    successes: int = 0

    @property
    def pass_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0


def append_attempt(path: str | os.PathLike, attempt: Attempt) -> None:
    """Append one attempt as a JSON line and flush it to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(attempt.to_json() + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_attempts(path: str | os.PathLike) -> list[Attempt]:
    """Read every attempt of a results file.

    A torn last line (a crash mid-write: not JSON, or cut inside a character) is skipped; a bad
    line elsewhere (not JSON, not UTF-8, a field of the wrong type) raises ``ResultsFormatError``
    naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No results file at {path} (crl eval writes one, "
                                f"format {FORMAT}: one JSON attempt a line).")
    lines = path.read_bytes().split(b"\n")
    attempts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)  # bytes: decoded as UTF-8, or a UnicodeDecodeError
            if not isinstance(record, dict):
                raise ResultsFormatError(f"a JSON {type(record).__name__}, not an object")
            attempts.append(Attempt.from_record(record))
        except (ValueError, RecursionError) as err:  # JSON, UTF-8 and ResultsFormatError
            is_last = all(not rest.strip() for rest in lines[number:])
            if is_last and not isinstance(err, ResultsFormatError):
                continue
            shown = line[:120].decode("utf-8", "backslashreplace")
            raise ResultsFormatError(f"{path}:{number}: not a {FORMAT} attempt record "
                                     f"({str(err)[:160]}): {shown}") from err
    return attempts


def tally(attempts: list[Attempt]) -> dict[str, TaskTally]:
    """Attempts and successes per task id, in first-seen order."""
    tallies: dict[str, TaskTally] = {}
    for attempt in attempts:
        entry = tallies.setdefault(attempt.task_id, TaskTally())
        entry.attempts += 1
        entry.successes += int(attempt.won)
    return tallies
