"""Batched retrieval scoring: a batch of queries gets exactly what each query gets alone, and
what bm25s itself scores; a burst of concurrent retrievals through the manager likewise."""

from __future__ import annotations

import random
import re
import threading
import time

import numpy as np
import pytest

from crl_harness.config import ExperienceConfig
from crl_harness.experience import (
    AddEntry,
    ExperienceBank,
    ExperienceManager,
    ManagerConfig,
)
from crl_harness.experience.retrieval import BM25Index, DenseIndex, bm25s, tokenize

WORDS = ("push box target corner wall stuck plan route move key door lava boulder monster "
         "stairs dark room north south east west agent goal step turn path cell grid").split()


def corpus(rng: random.Random, n: int) -> list[str]:
    """``n`` texts from a small vocabulary, with exact duplicates (equal scores: ties)."""
    texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 12))) for _ in range(n)]
    for i in rng.sample(range(n), n // 5):
        texts[i] = texts[rng.randrange(n)]
    return texts


def random_queries(rng: random.Random, n: int) -> list[str]:
    """Random queries, and the awkward ones: empty, unknown words only, stop words only,
    repeated terms, unknown words among known ones."""
    queries = ["", "xyzzy plugh", "the of and", "box box box target", "xyzzy wall"]
    queries += [" ".join(rng.choices(WORDS, k=rng.randint(1, 8))) for _ in range(n)]
    return queries


def test_batched_bm25_equals_single_query_and_bm25s():
    rng = random.Random(0)
    texts = corpus(rng, 400)
    ids = [f"e{i}" for i in range(len(texts))]
    index = BM25Index.from_texts(ids, texts)
    queries = random_queries(rng, 300)
    single = [index.search(q, 16) for q in queries]
    # Any split into batches gives the same ids, order and (bit-equal) scores.
    start = 0
    while start < len(queries):
        size = rng.choice([1, 2, 7, 32, 64, 200])
        assert index.search_many(queries[start:start + size], 16) == single[start:start + size]
        start += size
    assert index.search_many(queries, 16) == single
    assert single[:3] == [[], [], []]  # empty, unknown-only and stop-word-only queries
    assert single[4] == index.search("wall", 16)  # unknown words add nothing

    reference = bm25s.BM25()
    reference.index([tokenize(t) for t in texts], show_progress=False)
    for query, found in zip(queries, single, strict=True):
        tokens = tokenize(query)
        scores = reference.get_scores(tokens) if tokens else np.zeros(len(texts))
        positive = int((scores > 0).sum())
        assert len(found) == min(16, positive)
        if not found:
            continue
        rows = [int(i[1:]) for i, _ in found]
        np.testing.assert_allclose([s for _, s in found], scores[rows] / scores.max(), rtol=1e-5)
        values = [s for _, s in found]
        assert values == sorted(values, reverse=True)
        # Ties (equal scores) go to the entry indexed first.
        for (a, sa), (b, sb) in zip(found, found[1:], strict=False):
            if sa == sb:
                assert int(a[1:]) < int(b[1:])
        # Nothing left out scores above the last one returned.
        left_out = np.delete(scores, rows)
        assert left_out.max(initial=0.0) <= scores[rows[-1]] * (1 + 1e-5)


def test_ties_go_to_the_first_entry_alone_and_in_a_batch():
    index = BM25Index.from_texts(["a", "b", "c", "d"], ["lava river", "push box", "lava river",
                                                        "lava river"])
    expected = [("a", 1.0), ("c", 1.0)]
    assert index.search("cross the lava", 2) == expected
    assert index.search_many(["push", "cross the lava", ""], 2) == [[("b", 1.0)], expected, []]
    assert BM25Index([], []).search_many(["lava", ""], 3) == [[], []]


def test_batched_dense_search_equals_single_rows():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(300, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    # a tie that is exact in any summation order (BLAS may sum two equal rows differently)
    vectors[3] = vectors[7] = np.eye(16, dtype=np.float32)[0]
    index = DenseIndex([f"e{i}" for i in range(300)], vectors)
    queries = np.concatenate([vectors[[3, 10]], rng.normal(size=(40, 16)).astype(np.float32)])
    batch = index.search_many(queries, 5)
    assert batch[0][:2] == [("e3", pytest.approx(1.0)), ("e7", pytest.approx(1.0))]
    for query, found in zip(queries, batch, strict=True):
        alone = index.search_many(query[None, :], 5)[0]
        assert [i for i, _ in alone] == [i for i, _ in found]
        np.testing.assert_allclose([s for _, s in alone], [s for _, s in found], rtol=1e-6)
        exact = vectors @ query
        assert [i for i, _ in found] == [f"e{i}" for i in np.argsort(-exact, kind="stable")[:5]]


def test_hardening_search_rejects_n_below_one():
    bm25 = BM25Index.from_texts(["a"], ["push box"])
    dense = DenseIndex(["a"], np.ones((1, 2), dtype=np.float32))
    for call in (lambda: bm25.search("box", 0), lambda: bm25.search_many(["box"], -1),
                 lambda: dense.search_many(np.ones((1, 2), dtype=np.float32), 0)):
        with pytest.raises(ValueError, match="n >= 1"):
            call()


def test_concurrent_burst_gets_single_query_results(tmp_path):
    """64 episodes that reset together: each caller gets what the index ranks first for its
    query (no re-rank randomness here), whatever batches the manager formed."""
    rng = random.Random(1)
    env_id = "CRL/Sokoban-v0"
    bank = ExperienceBank(tmp_path / "bank.sqlite")
    bank.apply([AddEntry(env_id, f"t{i}", text, "g") for i, text in enumerate(corpus(rng, 300))])
    config = ManagerConfig.from_config(ExperienceConfig(count_penalty=0.0, demotion_prob=0.0))
    manager = ExperienceManager(bank, config=config)
    queries = random_queries(rng, 59)
    index = BM25Index.from_texts([e.id for e in bank.entries(env_id)],
                                 [e.text for e in bank.entries(env_id)])
    expected = [[i for i, _ in index.search(q, 1)] for q in queries]
    got: list[list[str] | None] = [None] * len(queries)
    barrier = threading.Barrier(len(queries))

    def client(i: int) -> None:
        barrier.wait()
        got[i] = [e.id for e in manager.retrieve(env_id, queries[i], 1)]

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(queries))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == expected
    assert manager.stats()["retrievals"] == len(queries)
    manager.close()
    bank.close()


def test_hardening_manager_rejects_bad_batch_times():
    for bad in ({"batch_gap_s": -0.001}, {"batch_wait_s": float("nan")}):
        with pytest.raises(ValueError, match="seconds >= 0"):
            ManagerConfig(**bad)


@pytest.mark.parametrize("batch_gap_s", [0.0, 0.5])
def test_batch_gap_decides_whether_queries_that_queue_share_a_batch(tmp_path, monkeypatch,
                                                                    batch_gap_s):
    """While a slow first query holds the search slot, the next ones queue 10 ms apart: with no
    gap each queued query is its own batch; a gap longer than their spacing makes them one."""
    rng = random.Random(2)
    env_id = "CRL/Sokoban-v0"
    bank = ExperienceBank(tmp_path / "bank.sqlite")
    bank.apply([AddEntry(env_id, f"t{i}", text, "g") for i, text in enumerate(corpus(rng, 50))])
    manager = ExperienceManager(bank, config=ManagerConfig(batch_gap_s=batch_gap_s,
                                                           batch_wait_s=5.0))
    search, calls = BM25Index.search_tokens_many, []

    def first_call_slow(self, queries, n):
        calls.append(len(queries))
        if len(calls) == 1:
            time.sleep(1.0)  # longer than all the arrivals, even on a busy machine
        return search(self, queries, n)

    monkeypatch.setattr(BM25Index, "search_tokens_many", first_call_slow)
    queries = random_queries(rng, 10)
    threads = [threading.Thread(target=manager.retrieve, args=(env_id, q, 1)) for q in queries]
    for thread in threads:
        thread.start()
        time.sleep(0.01)
    for thread in threads:
        thread.join()
    manager.close()
    bank.close()
    assert calls[0] == 1 and sum(calls) == len(queries)
    assert len(calls) >= len(queries) // 2 if batch_gap_s == 0.0 else calls[1:] == [len(queries) - 1]


def test_hardening_a_failing_search_reaches_every_caller_and_the_manager_goes_on(tmp_path,
                                                                               monkeypatch):
    """A search that raises answers each waiting caller with its error, however the manager
    served them (inline or in a batch), instead of leaving them blocked; the next burst works."""
    rng = random.Random(3)
    env_id = "CRL/Sokoban-v0"
    bank = ExperienceBank(tmp_path / "bank.sqlite")
    bank.apply([AddEntry(env_id, f"t{i}", text, "g") for i, text in enumerate(corpus(rng, 50))])
    manager = ExperienceManager(bank, config=ManagerConfig(batch_wait_s=5.0))
    search, failing = BM25Index.search_tokens_many, [True]

    def broken(self, queries, n):
        if failing[0]:
            raise MemoryError("index gone")
        return search(self, queries, n)

    monkeypatch.setattr(BM25Index, "search_tokens_many", broken)
    queries = random_queries(rng, 8)
    outcomes: list[object] = [None] * len(queries)

    def client(i: int) -> None:
        try:
            outcomes[i] = manager.retrieve(env_id, queries[i], 1)
        except MemoryError as err:
            outcomes[i] = err

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(queries))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert all(isinstance(o, MemoryError) for o in outcomes)
    failing[0] = False
    assert any(manager.retrieve(env_id, q, 1) for q in queries)
    manager.close()
    with pytest.raises(RuntimeError, match="closed"):
        manager.retrieve(env_id, queries[0], 1)
    bank.close()


@pytest.mark.parametrize("settings, spread", [
    ([], True),                                                        # released: 0.4, 0.5
    (["experience.count_penalty=0", "experience.demotion_prob=0"], False),
    (["experience.count_penalty=0", "experience.demotion_prob=1"], True),  # demotion alone
    (["experience.count_penalty=0.4", "experience.demotion_prob=0"], True),  # penalty alone
    (["experience.count_penalty=0", "experience.demotion_prob=1",
      "experience.recency_window_s=0"], False),                        # nothing is recent
])
def test_rerank_settings_of_the_config_change_the_ranking(tmp_path, settings, spread):
    """``experience.count_penalty``, ``demotion_prob`` and ``recency_window_s`` reach the
    training run's Experience Manager: retrieved again and again for one level's key, its own
    lesson keeps the top slot only with the re-rank off (or nothing recent to demote)."""
    from crl_harness.config import load_config
    from crl_harness.models import HFBackend
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.training.experience_service import ExperienceService

    cfg = load_config(None, settings)
    backend = HFBackend(build_tiny_model(tmp_path / "tiny"))
    service = ExperienceService(tmp_path / "run", cfg.experience, backend, max_new_tokens=8,
                                temperature=1.0, top_p=1.0)
    try:
        env = "CRL/MiniHackRoom-v0"
        service.manager.apply([
            AddEntry(env, "Winning moves from x=38, y=10; in view: nothing notable",
                     "from the start, play north, east."),
            AddEntry(env, "Winning moves from x=38, y=11; in view: nothing notable",
                     "from the start, play south.")])
        assert service.manager.flush(timeout=60)
        key = "x=38, y=10; in view: nothing notable"
        seen = [service.manager.retrieve(env, key, 1)[0].title for _ in range(12)]
        assert seen[0].startswith("Winning moves from x=38, y=10")
        assert (len(set(seen)) == 2) is spread
    finally:
        service.close()


@pytest.mark.parametrize("coverage, handed", [
    (0.0, ["x=38, y=10"]),  # off: the nearest lesson, another level's
    (0.75, ["x=38, y=10"]),  # 3 of the key's 4 words are in it
    (1.0, []),  # the key's every word: this level has no lesson of its own, and gets none
])
def test_query_coverage_floor_hands_a_level_without_a_lesson_none(tmp_path, coverage, handed):
    """``experience.min_query_coverage`` reaches the training run's Experience Manager: a level
    key whose level has no lesson retrieves another level's (sharing "in view: nothing
    notable") only while the floor lets it; the level with a lesson gets its own either way."""
    from crl_harness.config import load_config
    from crl_harness.models import HFBackend
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.training.experience_service import ExperienceService

    cfg = load_config("cpu-demo", [f"experience.min_query_coverage={coverage}"])
    backend = HFBackend(build_tiny_model(tmp_path / "tiny"))
    service = ExperienceService(tmp_path / "run", cfg.experience, backend, max_new_tokens=8,
                                temperature=1.0, top_p=1.0)
    try:
        env = "CRL/MiniHackRoom-v0"
        service.manager.apply([AddEntry(env, "Winning moves from x=38, y=10; in view: nothing "
                                        "notable", "from the start, play north, east.")])
        assert service.manager.flush(timeout=60)
        own = service.manager.retrieve(env, "x=38, y=10; in view: nothing notable", 1)
        assert [e.title for e in own] == ["Winning moves from x=38, y=10; in view: nothing notable"]
        other = service.manager.retrieve(env, "x=40, y=11; in view: nothing notable", 1)
        assert [e.title.removeprefix("Winning moves from ")[:10] for e in other] == handed
    finally:
        service.close()


def test_hardening_query_coverage_is_a_share_read_by_bm25_only():
    from crl_harness.config import ConfigError, load_config

    for setting, message in (("experience.min_query_coverage=1.5", "must be in [0, 1]"),
                             ("experience.min_query_coverage=-0.1", "must be in [0, 1]")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(None, [setting])
    with pytest.raises(ConfigError, match="only experience.retrieval: bm25 reads"):
        load_config(None, ["experience.retrieval=dense", "experience.min_query_coverage=1"])
