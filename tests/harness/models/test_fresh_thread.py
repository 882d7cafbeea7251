"""Torch work of the harness's long-lived helper threads runs in threads that end with it
(``crl_harness.models.fresh_thread``): a live thread that ran torch keeps a GNU OpenMP team and
throttles the main thread's (``benchmarks/helper_thread_bench.py``)."""

from __future__ import annotations

import threading

import pytest

from crl_harness.models.base import Generation
from crl_harness.models.batched import BatchedGenerator
from crl_harness.models.fresh_thread import call_in_fresh_thread


def test_call_in_fresh_thread_returns_the_result_from_a_thread_that_has_ended():
    ran_in = []

    def work() -> int:
        ran_in.append(threading.current_thread())
        return 7

    assert call_in_fresh_thread(work) == 7
    [thread] = ran_in
    assert thread is not threading.current_thread()
    assert not thread.is_alive()


def test_call_in_fresh_thread_raises_the_calls_error_in_the_caller():
    def work() -> None:
        raise KeyError("lost")

    with pytest.raises(KeyError, match="lost"):
        call_in_fresh_thread(work)


class _RecordingBackend:
    """Answers every chat with its own text; notes the thread each generate ran in."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def generate(self, prompts, *, max_new_tokens, temperature, top_p):
        self.threads.append(threading.current_thread())
        return [Generation(text=chat[0]["content"], prompt_token_ids=[], token_ids=[],
                           logprobs=[], finish_reason="stop") for chat in prompts]


def test_the_extractors_batches_generate_in_threads_that_end_with_them():
    backend = _RecordingBackend()
    generator = BatchedGenerator(backend, max_new_tokens=4, temperature=0.7, top_p=1.0)
    try:
        assert generator("first").text == "first"
        assert generator("second").text == "second"
    finally:
        generator.close()
    assert len(backend.threads) == 2
    # not the generator's own thread, which lives as long as the run
    assert all(thread is not generator._thread for thread in backend.threads)
    assert not any(thread.is_alive() for thread in backend.threads)


def test_a_failed_batch_reaches_its_callers():
    class Failing(_RecordingBackend):
        def generate(self, prompts, **kwargs):
            raise RuntimeError("engine died")

    generator = BatchedGenerator(Failing(), max_new_tokens=4, temperature=0.7, top_p=1.0)
    try:
        with pytest.raises(RuntimeError, match="engine died"):
            generator("a prompt")
    finally:
        generator.close()


def test_dense_retrievals_encoder_runs_in_a_thread_that_ends():
    import numpy as np

    from crl_harness.experience.retrieval import Embedder

    ran_in = []

    class Model:
        def encode(self, texts, **kwargs):
            ran_in.append(threading.current_thread())
            return np.ones((len(texts), 2))

    embedder = Embedder.__new__(Embedder)  # the sentence-transformers model is not the point
    embedder.model, embedder._lock, embedder.dim = Model(), threading.Lock(), 2
    assert embedder.encode(["a lesson", "another"]).shape == (2, 2)
    [thread] = ran_in
    assert thread is not threading.current_thread() and not thread.is_alive()
