"""Atomic checkpoints of a training run, and the RNG states they carry.

Holds ``Checkpointer`` (``save`` writes into a temporary directory that is renamed into place
only when complete, so a run killed at any moment leaves either the old checkpoint or the new
one, never half of one), ``checkpoint_run_id``, ``rng_state`` / ``set_rng_state``.

Layout: ``RUN_DIR/checkpoints/step-000010/`` holds whatever the trainer writes there (models,
optimiser states, the bank export, the extractor's reward buffer, ``rng.pt``, ``state.json``) and
``checkpoint.json``, the id of the run that wrote it: a checkpointer lists, loads and prunes only
its own run's checkpoints.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["Checkpointer", "checkpoint_run_id", "rng_state", "set_rng_state"]

_NAME = re.compile(r"^step-(\d{6,})$")
OWNER_FILE = "checkpoint.json"


def rng_state() -> dict[str, Any]:
    """The states of Python's, NumPy's and torch's global generators."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def checkpoint_run_id(checkpoint: str | os.PathLike) -> str | None:
    """The id of the run that wrote ``checkpoint`` (None: unreadable, or written before ids)."""
    try:
        return str(json.loads((Path(checkpoint) / OWNER_FILE).read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


_FULL_DISK_BYTES = 1 << 20
"""free space under which a failed checkpoint write is taken for a full disk (the write that
failed filled what was left)"""


class Checkpointer:
    """Saves numbered checkpoints of run ``run_id`` under ``run_dir/checkpoints`` and keeps its
    newest ``keep``; another run's checkpoints there are neither listed nor pruned.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> other = Checkpointer(folder, "run-a", keep=1).save(9, lambda d: None)
    >>> ckpt = Checkpointer(folder, "run-b", keep=1)
    >>> _ = ckpt.save(3, lambda d: (d / "state.json").write_text("{}"))
    >>> _ = ckpt.save(6, lambda d: (d / "state.json").write_text("{}"))
    >>> ckpt.latest().name, [p.name for p in ckpt.all()], other.exists()
    ('step-000006', ['step-000006'], True)
    """

    def __init__(self, run_dir: str | os.PathLike, run_id: str, keep: int = 2) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.run_id = run_id
        self.keep = keep

    def all(self) -> list[Path]:
        """This run's finished checkpoints, oldest first (temporary directories are not
        checkpoints)."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name)
                 and checkpoint_run_id(p) == self.run_id]
        return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call ``write(tmp_dir)``, make it durable, rename it to ``step-NNNNNN``, prune."""
        final = self.root / f"step-{step:06d}"
        if final.exists() and checkpoint_run_id(final) != self.run_id:
            raise FileExistsError(f"{final} is a checkpoint of another run; it was left as it is.")
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-*"):  # left by a run killed while saving
            shutil.rmtree(stale, ignore_errors=True)
        tmp = self.root / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            write(tmp)
            (tmp / OWNER_FILE).write_text(json.dumps({"run_id": self.run_id, "step": step}))
            _fsync_tree(tmp)
            if final.exists():  # re-saving a step (a resumed run): replace it whole
                old = self.root / f".tmp-old-{final.name}-{os.getpid()}"
                os.replace(final, old)
                os.replace(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, final)
        except BaseException as err:
            # torch's write errors on a full disk are not OSErrors and do not say so ("unexpected
            # pos 396544 vs 396496", "iostream error"): the disk is asked before the partial
            # checkpoint frees its space
            full = isinstance(err, Exception) and not isinstance(err, OSError) \
                and shutil.disk_usage(self.root).free < _FULL_DISK_BYTES
            shutil.rmtree(tmp, ignore_errors=True)
            if full:
                raise OSError(errno.ENOSPC, f"No space left on device: checkpoint {final.name} "
                              "was not written (the earlier ones are kept)", str(self.root)) \
                    from err
            raise
        dir_fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        for old in self.all()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final
