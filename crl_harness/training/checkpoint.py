"""Atomic checkpoints of a training run, what the trainer writes in them, and resuming from them.

Holds ``Checkpointer`` (``save`` writes into a temporary directory that is renamed into place
only when complete, so a run killed at any moment leaves either the old checkpoint or the new
one, never half of one), ``checkpoint_run_id``, ``rng_state`` / ``set_rng_state``; the trainer's
side: ``RunState`` (step, counters, extractor buffer), ``write_checkpoint``,
``checkpoint_to_resume``, ``load_checkpoint``, ``actor_adapter_base`` and ``save_merged_actor``.

Layout: ``RUN_DIR/checkpoints/step-000010/`` holds whatever the trainer writes there
(``write_checkpoint``: models and optimiser states ``actor.pt`` / ``extractor.pt``, the bank and
ledger export, ``trainer_state.pt`` with the RNG states and the extractor's buffer, the actor for
``crl eval`` in ``actor_hf/``, ``state.json``) and ``checkpoint.json``, the id of the run that
wrote it: a checkpointer lists, loads and prunes only its own run's checkpoints.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from crl_harness.models.model_card import write_adapter_card
from crl_harness.training.run_directory import ResumeError

if TYPE_CHECKING:
    from crl_harness.config import TrainConfig
    from crl_harness.experience import ExperienceOwner
    from crl_harness.training.learner import PolicyLearner

__all__ = ["Checkpointer", "checkpoint_run_id", "rng_state", "set_rng_state", "RunState",
           "write_checkpoint", "checkpoint_to_resume", "load_checkpoint", "actor_adapter_base",
           "save_merged_actor"]

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


# ---------------------------------------------------------------------------- the trainer's
@dataclass
class RunState:
    """What a checkpoint carries of the trainer besides its models, optimisers, bank and RNG
    states: the step, its counters and the used extractor generations not trained yet."""

    step: int
    awaiting_training: int
    counters: dict[str, float]


def write_checkpoint(directory: Path, state: RunState, *, cfg: TrainConfig,
                     actor: PolicyLearner, tokenizer: Any, extractor: PolicyLearner | None,
                     experience: ExperienceOwner | None) -> None:
    """Write models, optimisers, bank, extractor buffer, RNG states and step into
    ``directory`` (``Checkpointer.save``'s ``write``)."""
    torch.save({"model": actor.trainable_state_dict(), **actor.optimizer_state()},
               directory / "actor.pt")
    if extractor is not None:
        torch.save({"model": extractor.trainable_state_dict(),
                    **extractor.optimizer_state()}, directory / "extractor.pt")
        # The trained extractor as a model a later pass loads (test-time experience, M-c).
        extractor_base = actor_adapter_base(cfg.extractor.model if cfg.extractor.model != "same"
                                            else cfg.actor.model, extractor.lora)
        if extractor_base is not None:
            extractor.save_adapter(directory / "extractor_hf", extractor_base)
        else:
            extractor.save_merged(directory / "extractor_hf")
        tokenizer.save_pretrained(directory / "extractor_hf")
    # The generations awaiting training (with their credit so far) are in the ledger export.
    bank_entries = experience.export_state(directory) if experience else 0
    torch.save({"rng": rng_state(), "awaiting_training": state.awaiting_training},
               directory / "trainer_state.pt")
    # The actor for `crl eval hf:DIR`: its LoRA adapters alone (fp32, megabytes; loaded
    # merged into their base) when its base is a plain model, else a plain transformers
    # checkpoint (full fine-tuning, or fresh adapters on an adapter folder merged at load).
    base = actor_adapter_base(cfg.actor.model, actor.lora)
    if base is not None:
        actor.save_adapter(directory / "actor_hf", base)
        write_adapter_card(directory / "actor_hf", command=f"crl train {cfg.name}",
                           trained_on=f"{state.step} steps of crl-gym training (arm "
                                      f"{cfg.arm}) on {', '.join(e.id for e in cfg.tasks.envs)}")
    else:
        actor.save_merged(directory / "actor_hf")
    tokenizer.save_pretrained(directory / "actor_hf")
    (directory / "state.json").write_text(json.dumps({
        "step": state.step, "name": cfg.name, "arm": cfg.arm,
        "bank_entries": bank_entries, "counters": dict(state.counters),
    }, indent=2))


def actor_adapter_base(model: str, lora: Any) -> str | None:
    """The base model a checkpoint's actor adapters name (``actor.model``: an embedded model's
    hub id, a shipped ``assets/...`` path as written, another local path made absolute), or None
    when the actor trains no adapters (``lora``: the learner's) or its model is an adapter
    folder merged at load."""
    from crl_harness.models.model_folder import is_adapter_folder
    from crl_harness.models.names import MODELS, resolve_model_path, upstream_id

    if lora is None:
        return None
    name = model.removeprefix("hf:")
    path = Path(resolve_model_path(name)).expanduser()
    if is_adapter_folder(path):
        return None
    if name in MODELS:  # its hub id: other tools find it, crl maps it back to its copy
        return upstream_id(name)
    if name.startswith("assets/") or not path.exists():
        return name
    return str(path.resolve())


def save_merged_actor(actor: PolicyLearner, tokenizer: Any, directory: Path) -> Path:
    """Export the actor as one plain transformers model, LoRA adapters merged in fp32
    (``crl eval`` and vLLM read it without peft)."""
    directory = Path(directory)
    actor.save_merged(directory)
    tokenizer.save_pretrained(directory)
    return directory


def checkpoint_to_resume(checkpoints: Checkpointer, arm: str) -> Path:
    """The checkpoint ``--resume`` continues from: the run's latest, which must be of ``arm``."""
    checkpoint = checkpoints.latest()
    if checkpoint is None:
        raise ResumeError(f"--resume: no checkpoint of run {checkpoints.run_id} under "
                          f"{checkpoints.root}; start over with --overwrite.")
    state = json.loads((checkpoint / "state.json").read_text())
    if state["arm"] != arm:
        raise ResumeError(f"{checkpoint} is a checkpoint of arm '{state['arm']}', not "
                          f"'{arm}'; resume with the same config.")
    return checkpoint


def load_checkpoint(checkpoint: Path, *, actor: PolicyLearner, extractor: PolicyLearner | None,
                    experience: ExperienceOwner | None) -> RunState:
    """Load ``write_checkpoint``'s models, optimisers, ledger and RNG states back into the
    given parts; returns the trainer's ``RunState``."""
    state = json.loads((checkpoint / "state.json").read_text())
    # Loaded to the CPU: a run checkpointed on a GPU resumes anywhere; the learners copy
    # weights and AdamW's state onto their parameters' device.
    actor_state = torch.load(checkpoint / "actor.pt", map_location="cpu", weights_only=False)
    actor.load_trainable_state_dict(actor_state["model"])
    actor.load_optimizer_state(actor_state)
    if extractor is not None:
        extractor_state = torch.load(checkpoint / "extractor.pt", map_location="cpu",
                                     weights_only=False)
        extractor.load_trainable_state_dict(extractor_state["model"])
        extractor.load_optimizer_state(extractor_state)
    if experience is not None:
        experience.import_ledger(checkpoint)
    trainer_state = torch.load(checkpoint / "trainer_state.pt", map_location="cpu",
                               weights_only=False)
    set_rng_state(trainer_state["rng"])
    return RunState(step=int(state["step"]),
                    awaiting_training=int(trainer_state.get("awaiting_training", 0)),
                    counters=state["counters"])
