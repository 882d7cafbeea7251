"""One training run per run directory.

Holds ``RunDirectory`` (``create`` for a fresh run, ``reopen`` for ``--resume``),
``RunDirectoryError`` and its ``ResumeError``, ``RUN_FILES`` (what a run writes in its folder),
``occupied`` and ``read_run_id``.

A run directory belongs to one run, named by the run id in ``run.json``. While the run is live it
holds an exclusive lock on ``run.lock``, so a second run, fresh or resumed, is refused before it
touches anything. A fresh run into a directory that holds another run (any of ``RUN_FILES``) is
refused too, naming ``--resume`` (continue that run) and ``--overwrite`` (delete it first); so a
fresh run always starts with an empty bank and an empty ``metrics.jsonl``, and its checkpoints
(which carry its run id) are the only ones it loads or prunes. Files that are no run's (a warm start
under ``warmstart/``, notes) are left alone.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import IO

from crl_envs.errors import UserFacingError

__all__ = ["RunDirectory", "RunDirectoryError", "ResumeError", "RUN_FILES", "occupied",
           "read_run_id"]

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
# run.json first: a run deleted halfway (--overwrite killed) is no run to resume, but still one
# to overwrite.
RUN_FILES = (RUN_FILE, "checkpoints", "bank.sqlite", "bank.sqlite-wal", "bank.sqlite-shm",
             "bank.sqlite.lock", "metrics.jsonl", "tensorboard", "learning_curve.png",
             "config.json")


class RunDirectoryError(UserFacingError):
    """The run directory cannot be used as asked (another run holds it, or it is live)."""


class ResumeError(RunDirectoryError):
    """``--resume`` found no run, no checkpoint of it, or a checkpoint of another arm."""


class RunDirectory:
    """The folder of one training run, locked while this object is open.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> run = RunDirectory.create(folder); run.close()
    >>> RunDirectory.create(folder)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    RunDirectoryError: ... holds another run ...
    >>> RunDirectory.reopen(folder).run_id == run.run_id
    True
    """

    def __init__(self, path: Path, run_id: str, lock: IO[str]) -> None:
        self.path = path
        self.run_id = run_id
        self._lock: IO[str] | None = lock

    @classmethod
    def create(cls, path: str | os.PathLike, *, overwrite: bool = False) -> RunDirectory:
        """A fresh run in ``path``: refused when another run is there, unless ``overwrite``
        (then that run's files are deleted first, ``run.json`` first of all)."""
        path = Path(path)
        lock = _lock(path)
        try:
            found = occupied(path)
            if found and not overwrite:
                raise RunDirectoryError(
                    f"{path} holds another run ({_describe(path, found)}); continue it with "
                    "--resume, delete it with --overwrite, or pick another run.output_dir.")
            _delete_run_files(path)
            run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
            tmp = path / f".{RUN_FILE}.tmp"
            tmp.write_text(json.dumps({"run_id": run_id, "created": time.time()}))
            os.replace(tmp, path / RUN_FILE)
        except BaseException:
            lock.close()
            raise
        return cls(path, run_id, lock)

    @classmethod
    def reopen(cls, path: str | os.PathLike) -> RunDirectory:
        """The run in ``path``, to resume; nothing on disk changes here."""
        path = Path(path)
        lock = _lock(path)
        try:
            run_id = read_run_id(path)
            if run_id is None:
                raise ResumeError(f"--resume: {path} holds no run to resume (no {RUN_FILE}); "
                                  "start a fresh run without --resume.")
        except BaseException:
            lock.close()
            raise
        return cls(path, run_id, lock)

    def discard(self) -> None:
        """Undo a fresh run that failed to start (a missing model, a bad bank): every run file
        here is its own (``create`` found none, or deleted them), so the folder is free again."""
        _delete_run_files(self.path)
        self.close()

    def close(self) -> None:
        """Release the lock (the run is no longer live)."""
        if self._lock is not None:
            self._lock.close()  # closing the descriptor releases the flock
            self._lock = None


def occupied(path: str | os.PathLike) -> list[str]:
    """The names of ``RUN_FILES`` that ``path`` holds (empty: no run is there)."""
    return [name for name in RUN_FILES if (Path(path) / name).exists()]


def read_run_id(path: str | os.PathLike) -> str | None:
    """The id of the run in ``path`` (None: no readable ``run.json``)."""
    try:
        return str(json.loads((Path(path) / RUN_FILE).read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _delete_run_files(path: Path) -> None:
    for name in occupied(path):  # in RUN_FILES' order: run.json first
        target = path / name
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()


def _lock(path: Path) -> IO[str]:
    """Hold ``path/run.lock`` (it names the holder's pid), or refuse: the run there is live."""
    path.mkdir(parents=True, exist_ok=True)
    handle = open(path / LOCK_FILE, "a+")  # noqa: SIM115 - held open while the run is live
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunDirectoryError(f"{path} is in use by a live run ({holder}); wait for it to end "
                                "or pick another run.output_dir.") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


def _describe(path: Path, found: list[str]) -> str:
    run_id = read_run_id(path)
    return f"run {run_id}" if run_id else ", ".join(found[:3])
