"""The experience side of a training run, built and checkpointed: the bank, the extractor's
batched generation and the Experience Manager over them.

Holds ``BatchedGenerator`` (the extractor callable the manager calls from several threads; the
calls are gathered into one batched ``generate``) and ``ExperienceService``, which builds the
three, exports and restores them, and closes them; its ``manager`` is what the trainer and the
rollouts call (an ``ExperienceClient``). The same class runs in the trainer's process or as a
Ray actor (``crl_harness.training.ray_backend``): every public method takes and returns plain,
picklable data.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from crl_harness.config import ExperienceConfig
from crl_harness.experience import ExperienceBank, ExperienceManager, ManagerConfig
from crl_harness.experience.bank_file import _writer_lock
from crl_harness.models.base import KV_CACHE_TOKENS, Generation, ModelBackend

__all__ = ["BatchedGenerator", "ExperienceService"]

BANK_FILE = "bank.sqlite"
BANK_EXPORT = "bank.jsonl"
LEDGER_FILE = "credit_ledger.pkl"


def _remove_bank_files(path: Path) -> None:
    """A bank file with its WAL, shared memory and lock files."""
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


class BatchedGenerator:
    """``prompt -> Generation`` for the Experience Manager's extractor threads.

    Prompts that arrive together are answered by one batched ``generate`` call. ``weights_lock``
    is held while generating, so an optimiser step taken under it never lands mid-generation.
    """

    def __init__(self, backend: ModelBackend, *, max_new_tokens: int, temperature: float,
                 top_p: float, max_batch: int = 8) -> None:
        self.backend = backend
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.max_batch = max_batch
        self.weights_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="extractor-generate")
        self._thread.start()

    def __call__(self, prompt: str) -> Generation:
        future: Future = Future()
        self._queue.put((prompt, future))
        return future.result()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            try:  # the manager's threads submit within milliseconds of each other
                while len(batch) < self.max_batch:
                    item = self._queue.get(timeout=0.05)
                    if item is None:
                        self._queue.put(None)
                        break
                    batch.append(item)
            except queue.Empty:
                pass
            try:
                with self.weights_lock:
                    generations = self.backend.generate(
                        [[{"role": "user", "content": prompt}] for prompt, _ in batch],
                        max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                        top_p=self.top_p)
                for (_, future), generation in zip(batch, generations, strict=True):
                    future.set_result(generation)
            except BaseException as err:  # the callers get the error instead of waiting forever
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


class ExperienceService:
    """The bank (``run_dir/bank.sqlite``), the extractor's generator and the ``manager`` over
    them (retrieval, distillation, credit: call it directly).

    ``extractor`` is a backend object (in one process: the very model the extractor learner
    trains) or a backend spec (a Ray actor builds its own copy, in ``dtype`` with
    ``kv_cache_tokens`` of KV cache, and receives new weights through ``load_extractor_weights``). ``format_failure_reward``: the
    opt-in reward of a malformed answer (None: not trained, see ``ManagerConfig``).
    """

    def __init__(self, run_dir: str | os.PathLike, config: ExperienceConfig,
                 extractor: ModelBackend | str, *, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int = 0, lora: Any = None, dtype: str = "auto",
                 kv_cache_tokens: int = KV_CACHE_TOKENS,
                 format_failure_reward: float | None = None,
                 exact_key_envs: Sequence[str] = ()) -> None:
        if isinstance(extractor, str):
            from crl_harness.models import load_backend

            extractor = load_backend(extractor, dtype=dtype, kv_cache_tokens=kv_cache_tokens)
            if lora is not None and lora.enabled:
                from crl_harness.training.learner import apply_lora

                apply_lora(extractor.model, lora)
        self.backend = extractor
        self.run_dir = Path(run_dir)
        self.bank = ExperienceBank(self.run_dir / BANK_FILE, capacity=config.capacity)
        self.generator = BatchedGenerator(extractor, max_new_tokens=max_new_tokens,
                                          temperature=temperature, top_p=top_p,
                                          max_batch=config.max_concurrent_extractions)
        self.manager = ExperienceManager(self.bank, self.generator, ManagerConfig.from_config(
            config, exact_key_envs, format_failure_reward=format_failure_reward, seed=seed))

    # ------------------------------------------------------------ weights
    @property
    def weights_lock(self) -> threading.Lock:
        """Held by the extractor's generation; an update of its weights takes it too."""
        return self.generator.weights_lock

    def load_extractor_weights(self, state: dict[str, Any], lora: bool = False) -> None:
        """New extractor weights for a copy living apart from the learner (a Ray actor)."""
        with self.generator.weights_lock:
            if lora:
                from peft import set_peft_model_state_dict

                set_peft_model_state_dict(self.backend.model, state)
            else:
                self.backend.load_weights(state)

    # ------------------------------------------------------------ checkpoints
    def export_state(self, directory: str | os.PathLike) -> int:
        """Flush, then write the bank (JSONL) and the generations awaiting credit to
        ``directory``; returns the number of entries."""
        directory = Path(directory)
        self.manager.flush()
        n = self.bank.export_jsonl(directory / BANK_EXPORT)
        with open(directory / LEDGER_FILE, "wb") as handle:
            pickle.dump({"ledger": self.manager.ledger.export(),
                         "records": self.manager.export_records()}, handle)
        return n

    def import_ledger(self, directory: str | os.PathLike) -> None:
        """The generations awaiting credit of a checkpoint (``export_state``'s), if it has any."""
        path = Path(directory) / LEDGER_FILE
        if path.exists():
            with open(path, "rb") as handle:
                saved = pickle.load(handle)
            if isinstance(saved, dict):  # the ledger and the entries' records
                self.manager.ledger.load(saved["ledger"])
                self.manager.load_records(saved["records"])
            else:  # a checkpoint from before the records were kept: the ledger alone
                self.manager.ledger.load(saved)

    @staticmethod
    def restore_bank(run_dir: str | os.PathLike, source: str | os.PathLike,
                     capacity: int | None = None) -> None:
        """Replace ``run_dir``'s bank by the entries of ``source`` (a checkpoint folder, whose
        ``bank.jsonl`` is read, or such a file), before the service opens it: on ``--resume``,
        what the extractor wrote after the checkpoint is undone, as the steps are re-run.

        The new bank is built beside the old one and renamed over it only once complete, under
        the old bank's writer lock: a bank open in a live run refuses (``BankError``) and a
        failure (e.g. ``capacity``, the run's ``experience.capacity``, smaller than the export:
        a resume never drops what a checkpoint saved) leaves the old bank as it was."""
        run_dir, source = Path(run_dir), Path(source)
        export = source / BANK_EXPORT if source.is_dir() else source
        bank_path = run_dir / BANK_FILE
        staged = run_dir / f".{BANK_FILE}.restoring"
        run_dir.mkdir(parents=True, exist_ok=True)
        with _writer_lock(bank_path):
            _remove_bank_files(staged)
            try:
                bank = ExperienceBank(staged, capacity=capacity)
                try:
                    if export.exists():
                        bank.import_jsonl(export, evict=False)
                finally:
                    bank.close()
                # the old bank's WAL would be replayed into the new file: it goes first
                for suffix in ("-wal", "-shm"):
                    Path(f"{bank_path}{suffix}").unlink(missing_ok=True)
                os.replace(staged, bank_path)
            finally:
                _remove_bank_files(staged)

    def close(self) -> None:
        self.manager.close()
        self.generator.close()
        self.bank.close()

