"""How far training has to go: one run, its held-out success at several steps.

    .venv/bin/python benchmarks/pilot_curve.py                       # cpu-demo, arm none, 12 steps
    .venv/bin/python benchmarks/pilot_curve.py --steps 8 --eval-at 4 8 --levels 32

One fresh run of ``--config`` (default ``cpu-demo``) in ``--arm`` (default ``none``: plain GRPO, no
bank) trains ``--steps`` steps with a checkpoint at every step of ``--eval-at``; the warm start
and each of those checkpoints then play the same ``--levels`` held-out levels greedily, one
episode a level, without a bank. Printed: the success of each with its 95% Wilson interval and
its paired difference against the warm start (95% interval, McNemar's exact p); every level's
outcome goes to ``OUT/curve.json``. ``--set key=value`` overrides the config (e.g.
``actor.lr=3e-4``); ``--dtype`` the evaluations' weights (default: the run's ``actor.dtype``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--arm", default="none", choices=("co-evolve", "static", "none"))
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--eval-at", type=int, nargs="+", default=[4, 8, 12],
                        help="steps whose checkpoint plays the held-out levels")
    parser.add_argument("--levels", type=int, default=64, help="held-out levels (default 64)")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="key=value")
    parser.add_argument("--dtype", default=None, help="weights of the evaluations")
    parser.add_argument("--out", default=None, help="a new folder (default runs/pilot-TIMESTAMP)")
    args = parser.parse_args()

    from crl_harness.config import HELDOUT_RESERVED, ConfigError, load_config

    if not 1 <= args.steps <= 1000 or not 1 <= args.levels <= HELDOUT_RESERVED:
        parser.error(f"--steps must be in 1..1000 and --levels in 1..{HELDOUT_RESERVED}")
    if not all(1 <= s <= args.steps for s in args.eval_at):
        parser.error(f"every --eval-at step must be in 1..--steps ({args.steps})")
    eval_at = sorted(set(args.eval_at))
    out = Path(args.out or time.strftime("runs/pilot-%Y%m%d-%H%M%S"))
    # a checkpoint at every eval step, all kept
    every = math.gcd(*eval_at)
    try:
        cfg = load_config(args.config, [
            *args.set, f"arm={args.arm}", f"run.steps={args.steps}",
            f"run.output_dir={out / 'run'}", f"run.checkpoint_every={every}",
            f"run.keep_checkpoints={args.steps // every + 1}", "run.tensorboard=false"])
    except ConfigError as err:
        parser.error(str(err))

    from crl_harness.commands import train as train_command
    from crl_harness.eval import format_paired, format_rate
    from crl_harness.eval.heldout import default_cache, evaluate_levels, paired
    dtype = args.dtype or cfg.actor.dtype
    t = cfg.tasks
    levels = list(range(t.heldout_offset, t.heldout_offset + args.levels))
    started = time.perf_counter()
    train_command.train(cfg)
    trained = time.perf_counter() - started
    actors = {0: cfg.starting_model(), **{step: f"hf:{out / 'run' / 'checkpoints' / f'step-{step:06d}' / 'actor_hf'}"
                          for step in eval_at}}
    outcomes = {}
    for step, actor in actors.items():
        outcomes[step] = evaluate_levels(
            cfg, actor, {"held-out": (levels, False)}, out / f"eval-step{step}",
            cache=default_cache() if step == 0 else None, dtype=dtype)["held-out"]
    print(f"\n{cfg.name}, arm {args.arm}: held-out success on {args.levels} levels, greedy, "
          f"weights {dtype} (training {trained:.0f} s, all {time.perf_counter() - started:.0f} s)")
    report = {"args": vars(args), "trained_seconds": trained, "steps": {}}
    for step, won in outcomes.items():
        d = paired(outcomes[0], won)
        line = format_rate(d.b_wins, d.n)
        if step:
            line += "; minus the warm start: " + format_paired(d, "warm start", f"step {step}")
        print(f"  step {step:>3}: {line}")
        report["steps"][step] = {"actor": actors[step], "paired": d.to_dict(),
                                 "levels": {str(s): w for s, w in won.items()}}
    (out / "curve.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {out / 'curve.json'}")


if __name__ == "__main__":
    main()
