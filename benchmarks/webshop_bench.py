"""WebShop: search fidelity against real Lucene, oracle success, and speed.

Prints, on the small catalogue (``../shared/data/webshop`` or ``$CRL_DATA_DIR``):
- agreement with real Lucene's top-50 for 531 queries (top-1, top-10 set, top-10 order, top-50
  order) of this package's exact scorer, and of the field libraries with the same analyzer:
  bm25s (``method="lucene"``) and rank-bm25 (``BM25Okapi``), the reason for the exact scorer;
- the scripted oracle's success on the 500 test goals, and how many of them upstream's reward
  can score 1.0 at all;
- medians of several runs: start-up (catalogue, index, goals), ms per search query, ms per env
  step (oracle and random-click episodes), env steps per second.

Run: ``.venv/bin/python benchmarks/webshop_bench.py [--repeats 5]``
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import gymnasium as gym

import crl_envs  # noqa: F401
from crl_envs.data import resolve_data
from crl_envs.oracles import make_oracle, play_episode
from crl_envs.webshop.env import shared_resources
from crl_envs.webshop.reward import get_reward
from crl_envs.webshop.search import analyze

ENV_ID = "CRL/WebShop-v0"


def lucene_reference():
    directory = resolve_data("webshop", required=("lucene_oracle/top50.tsv",)) / "lucene_oracle"
    queries = [line.rstrip("\n").split("\t", 2) for line in open(directory / "queries.tsv")]
    top50 = {}
    for line in open(directory / "top50.tsv"):
        query_id, *hits = line.rstrip("\n").split("\t")
        top50[query_id] = [hit.rsplit(":", 1)[0] for hit in hits if hit]
    return [(qid, text) for qid, _, text in queries], top50


def agreement(rank, queries, top50) -> dict[str, float]:
    counts = dict.fromkeys(("top1", "top10_set", "top10_order", "top50_order"), 0)
    for query_id, text in queries:
        got, want = rank(text), top50[query_id]
        counts["top1"] += got[:1] == want[:1]
        counts["top10_set"] += set(got[:10]) == set(want[:10])
        counts["top10_order"] += got[:10] == want[:10]
        counts["top50_order"] += got[:50] == want[:50]
    return {k: v / len(queries) for k, v in counts.items()}


def library_rankers(res):
    asins = [p["asin"] for p in res.catalogue.products]
    corpus = [analyze(text) for text in res.catalogue.search_texts]
    rankers = {}
    try:
        import bm25s

        model = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
        model.index(corpus, show_progress=False)

        def bm25s_rank(text):
            tokens = [t for t in analyze(text) if t in model.vocab_dict]
            if not tokens:
                return []
            scores = model.get_scores(tokens)
            order = sorted((i for i in range(len(asins)) if scores[i] > 0),
                           key=lambda i: (-scores[i], asins[i]))
            return [asins[i] for i in order[:50]]

        rankers["bm25s (lucene)"] = bm25s_rank
    except ImportError:
        print("bm25s not installed: skipped")
    try:
        from rank_bm25 import BM25Okapi

        okapi = BM25Okapi(corpus, k1=0.9, b=0.4)

        def okapi_rank(text):
            scores = okapi.get_scores(analyze(text))
            order = sorted(range(len(asins)), key=lambda i: (-scores[i], asins[i]))
            return [asins[i] for i in order[:50] if scores[i] != 0]

        rankers["rank-bm25 (BM25Okapi)"] = okapi_rank
    except ImportError:
        print("rank-bm25 not installed: skipped")
    return rankers


def median_ms(samples):
    return 1000 * statistics.median(samples)


def run_episodes(env, policy, episodes, rng):
    step_times = []
    for episode in range(episodes):
        obs, info = env.reset(options={"task_id": episode % 500})
        policy.reset(obs, info) if hasattr(policy, "reset") else None
        terminated = truncated = False
        while not (terminated or truncated):
            action = policy.act(obs, info) if hasattr(policy, "act") else policy(info, rng)
            start = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            step_times.append(time.perf_counter() - start)
    return step_times


def random_clicks(info, rng):
    """A shopper that searches first, then clicks anything clickable (buying ends the episode)."""
    actions = info["admissible_actions"]
    if actions == ["search[<query>]"]:
        return f"search[{info['task']}]"
    return rng.choice(actions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    startup = []
    for _ in range(args.repeats):
        shared_resources.cache_clear()
        start = time.perf_counter()
        res = shared_resources()
        startup.append(time.perf_counter() - start)
    print(f"start-up (catalogue, Lucene index, 6,910 goals): median {median_ms(startup):.0f} ms")

    queries, top50 = lucene_reference()
    asins = [p["asin"] for p in res.catalogue.products]
    exact = agreement(lambda q: [asins[i] for i in res.engine.search(q, 50)], queries, top50)
    print(f"\nagreement with real Lucene on {len(queries)} queries:")
    print(f"  {'ranker':24s} top-1   top-10 set  top-10 order  top-50 order")
    rows = {"crl exact Lucene BM25": exact}
    for name, rank in library_rankers(res).items():
        rows[name] = agreement(rank, queries, top50)
    for name, row in rows.items():
        print(f"  {name:24s} {row['top1']:.4f}  {row['top10_set']:.4f}      "
              f"{row['top10_order']:.4f}        {row['top50_order']:.4f}")

    texts = [text for _, text in queries]
    per_query = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        for text in texts:
            res.engine.search(text, 50)
        per_query.append((time.perf_counter() - start) / len(texts))
    print(f"\nsearch: median {median_ms(per_query):.3f} ms per query (top 50 of 1,000)")

    env = gym.make(ENV_ID)
    oracle = make_oracle(ENV_ID, env)
    wins = 0
    for task_id in range(500):
        wins += play_episode(env, oracle, options={"task_id": task_id}).reward == 1.0
    winnable = sum(
        get_reward(res.catalogue.by_asin[g["asin"]], g, res.catalogue.prices[g["asin"]],
                   dict(g["goal_options"]), res.nouns)[0] == 1.0
        for g in res.goals[:500])
    print(f"\noracle: reward 1.0 on {wins}/500 test goals ({wins / 5:.1f}%); upstream's reward "
          f"gives 1.0 to the exact goal purchase on {winnable}/500")

    rng = random.Random(0)
    for name, policy in (("oracle", oracle), ("random clicks", random_clicks)):
        medians, means = [], []
        for _ in range(args.repeats):
            times = run_episodes(env, policy, 200, rng)
            medians.append(statistics.median(times))
            means.append(statistics.fmean(times))
        print(f"env step ({name} episodes): median {median_ms(medians):.3f} ms, mean "
              f"{median_ms(means):.3f} ms, {1 / statistics.median(means):.0f} steps/s")


if __name__ == "__main__":
    main()
