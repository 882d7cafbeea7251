"""The experience bank's JSONL export: one entry a line, written whole or not at all, read strictly.

Holds:
- ``write_jsonl``: entries as JSON lines, through a temporary file replaced at the end;
- ``read_jsonl``: the entries of an export, checked (``ValueError`` names the line of a malformed
  record) and cleaned as the bank stores text (``clean_text``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, fields
from pathlib import Path

from crl_harness.experience.entries import ExperienceEntry, _cleaned

__all__ = ["write_jsonl", "read_jsonl"]


def write_jsonl(path: str | os.PathLike, entries: Sequence[ExperienceEntry]) -> int:
    """Write ``entries`` as one JSON object a line; returns the count."""
    tmp = Path(f"{path}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for entry in entries:
            handle.write(json.dumps(asdict(entry), ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return len(entries)


def read_jsonl(path: str | os.PathLike) -> list[ExperienceEntry]:
    """The entries of a JSONL export, in its order; ``ValueError`` names a malformed line."""
    known = {f.name for f in fields(ExperienceEntry)}
    records: list[ExperienceEntry] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if not isinstance(data, dict) or set(data) - known:
                    raise ValueError(f"expected an object with keys from {sorted(known)}")
                entry = ExperienceEntry(**data)
                if not all(isinstance(getattr(entry, k), str)
                           for k in ("id", "env_id", "title", "content")):
                    raise ValueError("id, env_id, title and content must be strings")
            except (ValueError, TypeError) as err:
                raise ValueError(f"{path}:{number}: not an experience entry ({err}).") from err
            records.append(_cleaned(entry))
    return records
