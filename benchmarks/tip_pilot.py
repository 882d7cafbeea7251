"""Tip pilot: does an experience entry in the prompt change what the warm actor does?

    .venv/bin/python benchmarks/tip_pilot.py                 # cpu-demo, 16 held-out levels
    .venv/bin/python benchmarks/tip_pilot.py --episodes 8 --agent hf:RUN/checkpoints/.../actor_hf

On the config's first env and held-out levels (``tasks.heldout_offset``) it hand-makes, per level,
the entry the warm start teaches the actor to follow: the route an earlier unhurried oracle attempt
at that level found ("Winning moves from x=.., y=..: from the start, play ..."), and a wrong one,
the same entry with every move reversed. It plays the same levels three times with one loaded
model (greedy, the rollout engine of ``crl eval``): no entry, the level's correct entry, its wrong
entry, and prints success with 95% Wilson intervals and the differences in points.

Each episode is handed its own level's entry (a retriever keyed by the level's first
observation), not a BM25 search over all of them: in a dark room many levels start on the same
cell with the stairs out of sight, so no retrieval can tell them apart from the first
observation, and a search would measure that, not the actor. Levels whose first observation
another level shares are left out (the count is printed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east",
            "northeast": "southwest", "southwest": "northeast",
            "northwest": "southeast", "southeast": "northwest"}


class LevelEntries:
    """A retriever that hands an episode the entry written for its level (by first observation)."""

    def __init__(self, entries: dict[str, object]) -> None:
        self.entries = entries  # first observation -> ExperienceEntry

    def retrieve(self, env_id: str, query: str, k: int) -> list:
        first_observation = query.split("\n", 1)[1] if "\n" in query else query
        entry = self.entries.get(first_observation)
        return [entry][:k] if entry is not None else []


def level_entries(cfg, seeds: list[int], tokenizer) -> tuple[list[int], dict, dict]:
    """The levels with a first observation of their own and a route the oracle found; their
    correct and wrong entries keyed by that observation."""
    from crl_harness.warmstart.data import earlier_route
    from crl_harness.warmstart.routes import route_advice

    env = cfg.tasks.envs[0]
    found = {}
    for seed in seeds:
        route = earlier_route(env.id, seed, tokenizer=tokenizer, max_context=2048,
                              max_new_tokens=cfg.actor.max_new_tokens, history=cfg.actor.history,
                              env_kwargs=env.kwargs, options=env.options or None)
        if route is not None:
            found[seed] = route
    starts = [start for start, _ in found.values()]
    kept = [seed for seed, (start, _) in found.items() if starts.count(start) == 1]
    correct, wrong = {}, {}
    for seed in kept:
        start, route = found[seed]
        correct[start] = route_advice(env.id, start, route, entry_id=f"correct-{seed}")
        wrong[start] = route_advice(env.id, start, [OPPOSITE.get(m, m) for m in route],
                                    entry_id=f"wrong-{seed}")
    return kept, correct, wrong


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--agent", default=None, help="default: the actor the config starts from")
    parser.add_argument("--episodes", type=int, default=16, help="held-out levels tried")
    parser.add_argument("--out", default="runs/tip-pilot")
    args = parser.parse_args()
    if not 1 <= args.episodes <= 1000:
        parser.error("--episodes must be in 1..1000")

    from crl_harness.config import load_config
    from crl_harness.eval import episode_specs, evaluate, summarize, wilson_interval
    from crl_harness.models.registry import load_backend
    from crl_harness.rollout import RolloutConfig

    cfg = load_config(args.config)
    agent = args.agent or cfg.starting_model()
    env = cfg.tasks.envs[0]
    seeds = list(range(cfg.tasks.heldout_offset, cfg.tasks.heldout_offset + args.episodes))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backend = load_backend(agent)
    kept, correct, wrong = level_entries(cfg, seeds, backend.tokenizer)
    print(f"tip pilot: {agent} on {env.id} {env.kwargs}, held-out levels {seeds[0]}-{seeds[-1]}: "
          f"{len(kept)} with a first observation of their own and a route", flush=True)
    rollout = RolloutConfig.from_config(cfg, temperature=0.0, k=1, actor_critic_gate=False,
                                        search_and_ask=False, env_kwargs={env.id: dict(env.kwargs)})
    results = {}
    for name, entries in (("none", None), ("correct", correct), ("wrong", wrong)):
        started = time.perf_counter()
        trajectories = evaluate(agent, episode_specs([env.id], kept, entries is not None),
                                backend=backend, rollout=rollout,
                                retriever=LevelEntries(entries) if entries else None)
        summary = summarize(trajectories)[0]
        wins, n = summary.successes, summary.episodes
        low, high = wilson_interval(wins, n)
        results[name] = {"successes": wins, "episodes": n, "success": wins / n,
                         "interval": [low, high], "format_failure_rate":
                         summary.format_failure_rate, "seconds": time.perf_counter() - started}
        print(f"  {name:8s} {wins:3d}/{n} = {100 * wins / n:5.1f}%  [{100 * low:.1f}, "
              f"{100 * high:.1f}]  format failures {100 * summary.format_failure_rate:.0f}%  "
              f"({results[name]['seconds']:.0f} s)", flush=True)
    gain = 100 * (results["correct"]["success"] - results["none"]["success"])
    loss = 100 * (results["wrong"]["success"] - results["none"]["success"])
    print(f"correct entry vs none: {gain:+.1f} points; wrong entry vs none: {loss:+.1f} points")
    (out / "tip_pilot.json").write_text(json.dumps(
        {"agent": agent, "env": env.id, "env_kwargs": env.kwargs, "levels": kept,
         "results": results, "correct_minus_none": gain, "wrong_minus_none": loss}, indent=2))
    print(f"wrote {out / 'tip_pilot.json'}")


if __name__ == "__main__":
    main()
