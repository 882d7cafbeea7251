"""A warm start on held-out levels, env by env, beside the scripted oracle's ceiling.

    .venv/bin/python benchmarks/warmstart_heldout.py                     # mix3-cpu, 32 levels
    .venv/bin/python benchmarks/warmstart_heldout.py --config mix6-cpu --levels 16

The actor a config starts from (``TrainConfig.starting_model()``: its warm start) plays
``--levels`` held-out levels of every env of ``--config`` greedily, one episode a level, each env
with its kwargs, in the weights training samples with (``actor.dtype``; ``--dtype``), and the
scripted oracle plays the same levels. Printed per env: the actor's success with its 95% Wilson
interval, its format failures (replies outside ``<answer>``) over its turns, and the oracle's
success beside it. Reports go to ``OUT/actor/CASE/report.json`` and ``OUT/oracle/...``, the
counts to ``OUT/summary.json``; the actor's outcomes also to the held-out cache, where ``crl demo
--config`` finds its "before".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="mix3-cpu")
    parser.add_argument("--levels", type=int, default=32, help="held-out levels per env")
    parser.add_argument("--dtype", default=None, help="the actor's weights (default actor.dtype)")
    parser.add_argument("--out", default=None, help="a new folder (default runs/warm-TIMESTAMP)")
    args = parser.parse_args()

    from crl_harness.config import HELDOUT_RESERVED, ConfigError, load_config

    if not 1 <= args.levels <= HELDOUT_RESERVED:
        parser.error(f"--levels must be in 1..{HELDOUT_RESERVED}")
    try:
        cfg = load_config(args.config)
    except ConfigError as err:
        parser.error(str(err))
    out = Path(args.out or time.strftime("runs/warm-%Y%m%d-%H%M%S"))
    if out.exists():
        parser.error(f"--out {out} exists; give a new folder")

    from crl_harness.eval import format_rate
    from crl_harness.eval.heldout import default_cache, env_cases, evaluate_levels

    t = cfg.tasks
    levels = list(range(t.heldout_offset, t.heldout_offset + args.levels))
    cases = env_cases(cfg, {"held-out": (levels, False)})
    actor = cfg.starting_model()
    t0 = time.perf_counter()
    # Played even when cached (the format failures come from the reports of episodes played
    # now); the cache is written, so `crl demo --config` finds its "before" there.
    won = evaluate_levels(cfg, actor, cases, out / "actor", dtype=args.dtype or cfg.actor.dtype,
                          cache=default_cache(), refresh=True)
    actor_seconds = time.perf_counter() - t0
    oracle = evaluate_levels(cfg, "scripted", cases, out / "oracle")
    print(f"{actor} on {args.levels} held-out levels per env of {cfg.name}, greedy "
          f"({actor_seconds:.0f} s); the scripted oracle on the same levels:")
    rows = {}
    for name in cases:
        report = json.loads((out / "actor" / name / "report.json").read_text())
        episodes = [e for e in report["episodes"] if not e["error"]]
        turns = sum(e["steps"] for e in episodes)
        failures = sum(e["format_failures"] for e in episodes)
        wins, n = sum(won[name].values()), len(won[name])
        oracle_wins, oracle_n = sum(oracle[name].values()), len(oracle[name])
        rows[name] = {"success": [wins, n], "format_failures": [failures, turns],
                      "oracle_success": [oracle_wins, oracle_n]}
        print(f"  {name}: actor {format_rate(wins, n)}; format failures {failures}/{turns} "
              f"turns ({failures / max(turns, 1):.1%}); oracle {format_rate(oracle_wins, oracle_n)}")
    (out / "summary.json").write_text(json.dumps({"actor": actor, "levels": levels,
                                                  "envs": rows}, indent=2))


if __name__ == "__main__":
    main()
