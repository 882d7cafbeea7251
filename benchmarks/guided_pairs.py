"""Guided - free inside the training groups, pooled over finished runs (seeds) of one config.

    .venv/bin/python benchmarks/guided_pairs.py runs/seed0 runs/seed1

Reads each run folder's ``metrics.jsonl`` (the pairs the trainer counted every step,
``crl_harness.training.metrics.pooled_pairs``) and prints, per run and pooled over all of them,
guided against free on every group, on revisits and on first visits: each rate with its 95%
Wilson interval, the paired difference with its 95% interval and McNemar's exact p, as
``crl demo`` prints one run.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

MAX_RUNS = 64
MAX_METRICS_BYTES = 64 * 1024 * 1024


def run_metrics(run: Path) -> list[dict]:
    """The steps of ``run``'s ``metrics.jsonl`` (``read_metrics`` skips a line that is not JSON,
    as a killed run's torn last one); a missing or huge file, or one whose lines are not steps
    (a JSON object whose pair counts are finite numbers): ValueError."""
    from crl_harness.training.metrics import read_metrics

    path = run / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{run}: no metrics.jsonl (give a run folder of crl train or crl demo)")
    if path.stat().st_size > MAX_METRICS_BYTES:
        raise ValueError(f"{path}: over {MAX_METRICS_BYTES // 2**20} MiB, not a run's metrics")
    try:
        steps = read_metrics(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not text ({err})") from None
    if not steps or not all(_is_step(step) for step in steps):
        raise ValueError(f"{path}: not JSON lines of steps (a JSON object a line, its pairs_* "
                         "counts finite numbers)")
    return steps


def _is_step(step: object) -> bool:
    def number(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value)

    return isinstance(step, dict) and all(
        number(value) for key, value in step.items() if key.startswith("pairs"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (1..64)")
    args = parser.parse_args(argv)
    if len(args.runs) > MAX_RUNS:
        parser.error(f"at most {MAX_RUNS} runs")
    try:
        metrics = {run: run_metrics(run) for run in args.runs}
    except ValueError as err:
        parser.error(str(err))

    from crl_harness.eval import format_paired, format_rate
    from crl_harness.training.metrics import PAIR_SETS, pooled_pairs

    pooled = [m for steps in metrics.values() for m in steps]
    for name, steps in [*((str(run), s) for run, s in metrics.items()), ("pooled", pooled)]:
        for where, prefix in PAIR_SETS.items():
            d = pooled_pairs(steps, prefix)
            print(f"{name} | {where}: {d.n} pairs, guided {format_rate(d.b_wins, d.n)}, free "
                  f"{format_rate(d.a_wins, d.n)}; guided - free {format_paired(d, 'free', 'guided')}")


if __name__ == "__main__":
    main()
