"""An eval's output folder: its files, the lock that lets one eval at a time write there, and
the repairs ``crl eval --resume`` makes before it appends.

Holds ``RESULTS``, ``TRANSCRIPTS``, ``SETTINGS``, ``LOCK`` (the file names), ``lock_folder``,
``cut_torn_line`` and ``keep_transcripts``.

An episode is recorded in two appends: its transcript, then its attempt in ``results.jsonl``.
The attempt is the commit: an episode counts as played when its attempt is there. A kill
between the two appends leaves a transcript without an attempt, which ``keep_transcripts``
drops on ``--resume`` (the episode is played again); a kill mid-append leaves a torn last line,
which ``cut_torn_line`` cuts, so the next append starts on a line of its own.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import IO

from crl_envs.errors import UserFacingError

__all__ = ["RESULTS", "TRANSCRIPTS", "SETTINGS", "LOCK", "lock_folder", "cut_torn_line",
           "keep_transcripts"]

RESULTS, TRANSCRIPTS, SETTINGS = "results.jsonl", "transcripts.jsonl", "eval.json"
"""the files of an eval folder: attempts, one transcript an episode, the settings"""
LOCK = "eval.lock"
"""held (``flock``) by the eval writing the folder; it names the holder's pid"""


def lock_folder(folder: Path) -> IO[str]:
    """Hold ``folder/eval.lock`` until the returned file is closed, or refuse in one line: two
    evals appending to one folder would both play its missing episodes. The kernel releases the
    lock when the process dies, so a killed eval leaves no stale lock.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> held = lock_folder(folder)
        >>> lock_folder(folder)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        crl_envs.errors.UserFacingError: ... is in use by another crl eval (pid ...); ...
        >>> held.close()
    """
    handle = open(folder / LOCK, "a+", encoding="utf-8")  # noqa: SIM115 - held while the eval runs
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read(40).strip() or "pid unknown"
        handle.close()
        raise UserFacingError(f"{folder} is in use by another crl eval ({holder}); wait for it "
                              "to end, or pick another --out.") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


def cut_torn_line(path: Path) -> bool:
    """Cut an unfinished last line (no newline: a crash or a full disk mid-append) off the JSON
    lines file ``path``, so that the next record starts on a line of its own; True if one was
    cut. Every record is appended with its newline in one write, so a line without one was
    never finished."""
    try:
        handle = open(path, "r+b")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return False
    with handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return False
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return False
        keep = _end_of_last_line(handle, size)
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _end_of_last_line(handle: IO[bytes], size: int) -> int:
    """The offset just past the last newline of the file (0 when it holds none)."""
    block = 1 << 16
    end = size
    while end > 0:
        start = max(0, end - block)
        handle.seek(start)
        found = handle.read(end - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        end = start
    return 0


def keep_transcripts(path: Path, played: Collection[tuple[str, int]]) -> int:
    """Rewrite the transcripts file ``path`` to hold one transcript for each (env id, seed) in
    ``played`` (the episodes with an attempt, which ``--resume`` does not play again); return how
    many lines it dropped: transcripts of episodes that will be played again (an env error, a
    kill before the attempt was appended), repeats, and lines that are no transcript (torn,
    not JSON, not UTF-8). The new file replaces the old one whole, so a crash here loses
    nothing."""
    if not path.exists():
        return 0
    seen: set[tuple[str, int]] = set()
    dropped = 0
    tmp = path.with_name(path.name + ".tmp")
    with open(path, "rb") as source, open(tmp, "wb") as target:
        for line in source:
            key = _episode_of(line)
            if key is None or key not in played or key in seen:
                dropped += 1
                continue
            seen.add(key)
            target.write(line if line.endswith(b"\n") else line + b"\n")
        target.flush()
        os.fsync(target.fileno())
    if dropped:
        tmp.replace(path)
    else:
        tmp.unlink()
    return dropped


def _episode_of(line: bytes) -> tuple[str, int] | None:
    """The (env id, seed) of a transcript line, or None if it is no transcript."""
    if not line.endswith(b"\n"):
        return None  # torn
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON, or not UTF-8
        return None
    if not isinstance(record, dict):
        return None
    env_id, seed = record.get("env_id"), record.get("seed")
    if not isinstance(env_id, str) or not isinstance(seed, int) or isinstance(seed, bool):
        return None
    return env_id, seed
