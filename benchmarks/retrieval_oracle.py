"""Retrieval with oracle lessons: does a guided episode get its own level's lesson?

    .venv/bin/python benchmarks/retrieval_oracle.py               # cpu-demo, 32 levels, 64 episodes
    .venv/bin/python benchmarks/retrieval_oracle.py --levels 8 --print-seeds

The bank holds one perfect lesson per pool level: the route an earlier, unhurried run of the
scripted oracle found there (``crl_harness.warmstart.data.earlier_route``), written as the warm
start teaches the extractor to write it (``route_advice``). Guided episodes then reset as the
trainer resets them: the config's groups (``tasks.groups_per_step``) drawn by the trainer's
``TaskSampler`` over the pool, ``tasks.guided_per_group`` guided siblings each, through the
rollout engine's ``ExperienceAugmentation`` and the Experience Manager (its re-rank included),
until ``--episodes`` guided episodes have retrieved. A hit: the entry retrieved is the lesson of
the episode's own level.

Two pools of ``--levels`` levels: ``range`` (seeds ``tasks.seed_offset`` on, as
``tasks.seed_count`` gives them) and ``distinct`` (the first seeds on from there whose retrieval
keys differ: the list ``tasks.seeds`` takes, printed with ``--print-seeds``). Three retrievals:
``old`` (the query before the env's key existed: task text plus the whole first observation)
and ``key`` (``info["retrieval_query"]``), each under the released re-rank (count penalty 0.4,
demotion 0.5 within 300 s), and ``key`` with the re-rank off (``experience.count_penalty=0``,
``experience.demotion_prob=0``). Hits are printed with 95% Wilson intervals.
"""

from __future__ import annotations

import argparse
import math
import time


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate."""
    if n == 0:
        return float("nan"), float("nan")
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def pools(env, start: int, levels: int) -> tuple[dict[str, list[int]], dict[int, str]]:
    """``range``: seeds start..start+levels-1; ``distinct``: the first seeds from ``start`` whose
    ``info["retrieval_query"]`` differ; and the retrieval key of every seed of both."""
    first: dict[str, int] = {}
    key_of: dict[int, str] = {}
    seed = start
    while len(first) < levels or seed < start + levels:
        if seed - start > 50 * levels:
            raise SystemExit(f"only {len(first)} distinct retrieval keys in {seed - start} "
                             "levels; ask for fewer --levels")
        _, info = env.reset(seed=seed)
        key_of[seed] = info["retrieval_query"]
        first.setdefault(key_of[seed], seed)
        seed += 1
    return {"range": list(range(start, start + levels)),
            "distinct": sorted(first.values())[:levels]}, key_of


def config_and_pools(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The config of ``--config`` and ``--set`` (a bad one: a usage error) and ``pools`` of
    ``--levels`` levels of its first env."""
    import gymnasium as gym

    import crl_envs  # noqa: F401  (registers the ids)
    from crl_harness.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as err:
        parser.error(str(err))
    entry = cfg.tasks.envs[0]
    env = gym.make(entry.id, **entry.kwargs)
    try:
        return (cfg, *pools(env, cfg.tasks.seed_offset, args.levels))
    finally:
        env.close()


def lessons(env_id: str, seeds: list[int], play: dict) -> dict[int, object]:
    """Each level's oracle route lesson (a level the unhurried oracle does not win has none)."""
    from crl_harness.warmstart.data import earlier_route

    out = {}
    for seed in seeds:
        found = earlier_route(env_id, seed, **play)
        if found is not None:
            out[seed] = found[0]  # the entry the warm start would show, id route-SEED
    return out


def oracle_play(cfg) -> dict:
    """How the scripted oracle plays the config's first env for its lessons (as the warm start
    does): its tokenizer, context, reply length, history and env kwargs."""
    from transformers import AutoTokenizer

    from crl_harness.models.names import resolve_model_path

    entry = cfg.tasks.envs[0]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.warmstart.model[3:]))
    return {"tokenizer": tokenizer, "max_context": 8192,
            "max_new_tokens": cfg.actor.max_new_tokens, "history": cfg.actor.history,
            "env_kwargs": entry.kwargs, "options": entry.options or None}


def hit_rate(cfg, seeds: list[int], routes: dict, query: str, rerank: bool,
             episodes: int) -> tuple[int, int]:
    """Guided episodes (of levels that have a lesson) that retrieved their own level's lesson,
    with the released re-rank (``rerank``) or none."""
    from dataclasses import replace

    from crl_harness.config import ExperienceConfig
    from crl_harness.experience import ExperienceBank, ExperienceManager, ManagerConfig
    from crl_harness.rollout import make_env
    from crl_harness.training.sampler import TaskSampler

    e = cfg.experience
    # the re-rank's released settings (the defaults), whatever the config says; no floor
    rerank_off = {} if rerank else {"count_penalty": 0.0, "demotion_prob": 0.0}
    released = ExperienceConfig(retrieval=e.retrieval, **rerank_off)
    entry = cfg.tasks.envs[0]
    bank = ExperienceBank(":memory:")
    for seed, lesson in routes.items():
        bank.add(entry.id, lesson.title, lesson.content, generation_id=f"level-{seed}")
    manager = ExperienceManager(bank, config=ManagerConfig.from_config(released, seed=cfg.run.seed))
    env = make_env(entry.id, manager, e.k, **entry.kwargs)
    sampler = TaskSampler(replace(cfg.tasks, seeds=seeds), cfg.run.seed)
    hits = n = step = 0
    try:
        while n < episodes:
            step += 1
            for draw in sampler.sample(step):
                if draw.seed not in routes:
                    continue
                for _ in range(cfg.tasks.guided_per_group):
                    if query == "old":  # the query the wrapper made before the env's key
                        observation, info = env.unwrapped.reset(seed=draw.seed)
                        found = manager.retrieve(entry.id, f"{info['task']}\n{observation}", e.k)
                        ids = [item.id for item in found]
                    else:
                        _, info = env.reset(seed=draw.seed)
                        ids = info["experience_ids"]
                    got = [bank.get(i).generation_id for i in ids]
                    hits += f"level-{draw.seed}" in got
                    n += 1
    finally:
        env.close()
        manager.close()
        bank.close()
    return hits, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--levels", type=int, default=32, help="pool levels (1..256)")
    parser.add_argument("--episodes", type=int, default=64, help="guided episodes (1..4096)")
    parser.add_argument("--print-seeds", action="store_true",
                        help="print the distinct pool as a tasks.seeds override and stop")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides, e.g. tasks.groups_per_step=4")
    args = parser.parse_args()
    for name, low, high in (("levels", 1, 256), ("episodes", 1, 4096)):
        if not low <= getattr(args, name) <= high:
            parser.error(f"--{name} must be in {low}..{high}")

    cfg, pool, key_of = config_and_pools(parser, args)
    entry = cfg.tasks.envs[0]
    if args.print_seeds:
        print(f"tasks.seeds=[{','.join(map(str, pool['distinct']))}]")
        return

    play = oracle_play(cfg)
    t = cfg.tasks
    print(f"{args.config}: {entry.id} {entry.kwargs}; {args.levels} levels, {args.episodes} guided "
          f"episodes ({t.groups_per_step} groups x {t.guided_per_group} guided a step)")
    print(f"{'pool':<9} {'keys':>5} {'lessons':>7} {'query':<5} {'re-rank':<8} {'own lesson':>11} "
          f"{'rate':>6} {'95% CI':>13} {'secs':>5}")
    for name, seeds in pool.items():
        keys = len({key_of[s] for s in seeds})
        routes = lessons(entry.id, seeds, play)
        for query, rerank in (("old", True), ("key", True), ("key", False)):
            start = time.perf_counter()
            hits, n = hit_rate(cfg, seeds, routes, query, rerank, args.episodes)
            low, high = wilson(hits, n)
            print(f"{name:<9} {keys:>5} {len(routes):>7} {query:<5} {'on' if rerank else 'off':<8} "
                  f"{hits:>5}/{n:<5} {hits / n:>6.1%} {f'[{low:.0%}, {high:.0%}]':>13} "
                  f"{time.perf_counter() - start:>5.1f}")


if __name__ == "__main__":
    main()
