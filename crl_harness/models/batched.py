"""Concurrent generation calls gathered into batches: the Experience Manager's extractor threads
each call ``prompt -> Generation``; ``BatchedGenerator`` answers the calls that arrive together
with one batched ``generate`` of a ``ModelBackend``."""

from __future__ import annotations

import functools
import queue
import threading
from concurrent.futures import Future

from crl_harness.models.base import Generation, ModelBackend
from crl_harness.models.fresh_thread import call_in_fresh_thread

__all__ = ["BatchedGenerator"]


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
                chats = [[{"role": "user", "content": prompt}] for prompt, _ in batch]
                with self.weights_lock:
                    # in a thread that ends with the call: this one lives as long as the run,
                    # and a live thread that ran torch slows the main thread's (fresh_thread)
                    generations = call_in_fresh_thread(functools.partial(
                        self.backend.generate, chats, max_new_tokens=self.max_new_tokens,
                        temperature=self.temperature, top_p=self.top_p), "extractor-batch")
                for (_, future), generation in zip(batch, generations, strict=True):
                    future.set_result(generation)
            except BaseException as err:  # the callers get the error instead of waiting forever
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
