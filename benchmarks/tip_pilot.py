"""Tip pilot: does an experience entry in the prompt change what the warm actor does?

    .venv/bin/python benchmarks/tip_pilot.py                 # cpu-demo, 16 held-out levels
    .venv/bin/python benchmarks/tip_pilot.py --episodes 8 --agent hf:RUN/checkpoints/.../actor_hf

On the config's first env and held-out levels (``tasks.heldout_offset``), it writes two hand-made
banks: ``correct`` holds, per level, the route an earlier unhurried oracle attempt at that level
found ("Winning moves from x=.., y=..: from the start, play ..."), the entry the warm start teaches
the actor to follow; ``wrong`` holds the same entries with every move reversed. It checks that
retrieval by each level's first observation returns that level's entry, then runs ``crl eval``
three times on the same levels (no bank, ``--experience correct``, ``--experience wrong``) and
prints success with 95% Wilson intervals and the differences in points.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east",
            "northeast": "southwest", "southwest": "northeast",
            "northwest": "southeast", "southeast": "northwest"}


def build_banks(cfg, seeds: list[int], out: Path) -> tuple[Path, Path, int]:
    """Write ``correct.sqlite`` and ``wrong.sqlite``; returns their paths and how many levels
    retrieve their own entry first."""
    import gymnasium as gym
    from transformers import AutoTokenizer

    from crl_harness.experience import ExperienceBank, ExperienceManager
    from crl_harness.models.registry import resolve_model_path
    from crl_harness.warmstart.data import earlier_route, route_advice

    env = cfg.tasks.envs[0]
    # Only the route matters here; the oracle's prompts are rendered with the base's tokenizer.
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.warmstart.model.removeprefix("hf:")))
    paths = {name: out / f"{name}.sqlite" for name in ("correct", "wrong")}
    for path in paths.values():
        path.unlink(missing_ok=True)
    banks = {name: ExperienceBank(path) for name, path in paths.items()}
    starts = {}
    for seed in seeds:
        found = earlier_route(env.id, seed, tokenizer=tokenizer, max_context=2048,
                              max_new_tokens=cfg.actor.max_new_tokens, history=cfg.actor.history,
                              env_kwargs=env.kwargs, options=env.options or None)
        if found is None:
            print(f"  level {seed}: the oracle found no route; no entry", flush=True)
            continue
        start, route = found
        starts[seed] = start
        for name, moves in (("correct", route), ("wrong", [OPPOSITE.get(m, m) for m in route])):
            entry = route_advice(env.id, start, moves)
            banks[name].add(env.id, entry.title, entry.content)
    manager = ExperienceManager(banks["correct"])
    hits = 0
    for seed, start in starts.items():
        probe = gym.make(env.id, **env.kwargs)
        _, info = probe.reset(seed=seed)
        probe.close()
        [top] = manager.retrieve(env.id, f"{info.get('task', '')}\n{start}", 1)
        hits += route_advice(env.id, start, []).title == top.title
    manager.close()
    for bank in banks.values():
        bank.close()
    return paths["correct"], paths["wrong"], hits


def run_eval(agent: str, env, seeds: list[int], out: Path, bank: Path | None,
             max_new_tokens: int) -> dict:
    """One ``crl eval`` run; returns its report's summary of the env."""
    command = [sys.executable, "-m", "crl_harness.cli", "eval", "--agent", agent,
               "--envs", env.id, "--env-kwargs", json.dumps(env.kwargs),
               "--seeds", f"{seeds[0]}-{seeds[-1]}", "--max-new-tokens", str(max_new_tokens),
               "--out", str(out), "--no-progress"]
    if bank is not None:
        command += ["--experience", str(bank)]
    print("  $ crl " + shlex.join(command[3:]), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    return report["envs"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--agent", default=None, help="default: the config's actor.model")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--out", default="runs/tip-pilot")
    args = parser.parse_args()
    if not 1 <= args.episodes <= 1000:
        parser.error("--episodes must be in 1..1000")

    from crl_harness.config import load_config
    from crl_harness.eval import wilson_interval

    cfg = load_config(args.config)
    agent = args.agent or cfg.actor.model
    env = cfg.tasks.envs[0]
    seeds = list(range(cfg.tasks.heldout_offset, cfg.tasks.heldout_offset + args.episodes))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    correct, wrong, hits = build_banks(cfg, seeds, out)
    print(f"tip pilot: {agent} on {env.id} {env.kwargs}, held-out levels {seeds[0]}-{seeds[-1]}; "
          f"retrieval finds the level's own entry for {hits}/{len(seeds)} levels", flush=True)
    results = {}
    for name, bank in (("none", None), ("correct", correct), ("wrong", wrong)):
        started = time.perf_counter()
        summary = run_eval(agent, env, seeds, out / name, bank, cfg.actor.max_new_tokens)
        wins, n = summary["successes"], summary["episodes"]
        low, high = wilson_interval(wins, n)
        results[name] = {"successes": wins, "episodes": n, "success": wins / n,
                         "interval": [low, high], "seconds": time.perf_counter() - started}
        print(f"  {name:8s} {wins:3d}/{n} = {100 * wins / n:5.1f}%  "
              f"[{100 * low:.1f}, {100 * high:.1f}]  ({results[name]['seconds']:.0f} s)",
              flush=True)
    gain = 100 * (results["correct"]["success"] - results["none"]["success"])
    loss = 100 * (results["wrong"]["success"] - results["none"]["success"])
    print(f"correct entry vs none: {gain:+.1f} points; wrong entry vs none: {loss:+.1f} points")
    (out / "tip_pilot.json").write_text(json.dumps(
        {"agent": agent, "env": env.id, "env_kwargs": env.kwargs, "seeds": seeds,
         "retrieval_hits": hits, "results": results, "correct_minus_none": gain,
         "wrong_minus_none": loss}, indent=2))
    print(f"wrote {out / 'tip_pilot.json'}")


if __name__ == "__main__":
    main()
