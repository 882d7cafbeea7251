"""The mechanism's ceiling in the loop, in minutes: no training, the warm actor and the warm
extractor, each level played first and then revisited.

    .venv/bin/python benchmarks/revisit_check.py                        # cpu-demo, 16 levels
    .venv/bin/python benchmarks/revisit_check.py --levels 24 --out runs/revisit-24

Two steps of the trainer on the config (default ``cpu-demo``) with the actor frozen (its
warm-up covers both steps) and the warm extractor (arm ``static``), the revisit schedule with
``--levels`` groups a step: step 1 plays ``--levels`` new pool levels (its guided half plays
without experience: the retrieval warm-up) and distils them into an empty bank as training does
(the shortest win of each group, ``episodes_to_distill``); step 2 revisits every one of them,
its guided half handed what the bank holds for the level's own key (nothing, where step 1 wrote
no lesson: the coverage floor). Printed: guided - free inside the groups on the revisits (the
j-th guided episode of a group paired with its j-th free one; the paired 95% interval and
McNemar's p), the same on the first visits (a control: both halves played without experience),
the share of handed lessons that win replayed without a model, and the bank's size. Every step's
metrics are in ``--out/run/metrics.jsonl``.
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
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--levels", type=int, default=16, help="levels played twice (2..128)")
    parser.add_argument("--out", type=Path, default=Path("runs/revisit-check"))
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides, e.g. actor.rollout_engine=vllm")
    args = parser.parse_args()
    if not 2 <= args.levels <= 128:
        parser.error("--levels must be in 2..128")

    from crl_harness.config import ConfigError, load_config
    from crl_harness.eval import format_paired, format_rate
    from crl_harness.training.metrics import PAIR_SETS, pooled_pairs, read_metrics
    from crl_harness.training.trainer import Trainer

    fixed = ["arm=static", "run.steps=2", "actor.warmup_steps=2",
             "experience.retrieval_warmup_steps=1", "tasks.schedule=revisit",
             f"tasks.groups_per_step={args.levels}", "tasks.new_per_step=0",
             "run.checkpoint_every=2", "run.tensorboard=false",
             f"run.output_dir={args.out / 'run'}"]
    try:
        cfg = load_config(args.config, [*args.set, *fixed])
    except ConfigError as err:
        parser.error(str(err))
    if len(cfg.tasks.training_seeds()) < args.levels:
        parser.error(f"the pool holds {len(cfg.tasks.training_seeds())} levels; ask for at most "
                     "that many --levels")
    started = time.perf_counter()
    Trainer(cfg, overwrite=True).train()
    seconds = time.perf_counter() - started
    records = read_metrics(args.out / "run" / "metrics.jsonl")

    report: dict = {"config": args.config, "levels": args.levels, "seconds": seconds,
                    "overrides": args.set}
    print(f"\n{args.levels} levels of {cfg.tasks.envs[0].id}, the warm actor (frozen) and the "
          f"warm extractor; {seconds:.0f} s")
    for where, prefix in PAIR_SETS.items():
        d = pooled_pairs(records, prefix)
        if not d.n:
            continue
        report[where] = d.to_dict()
        print(f"  {where}: guided {format_rate(d.b_wins, d.n)}, free {format_rate(d.a_wins, d.n)}; "
              f"guided - free {format_paired(d, 'free', 'guided')}")
    revisit = records[-1]
    handed = int(revisit.get("lessons/handed", 0))
    rate = revisit.get("lessons/replay_win_rate", float("nan"))
    report["lessons_handed"] = handed
    report["lessons_win_replayed"] = round(handed * rate) if handed else 0
    report["bank_size"] = revisit.get("bank/size")
    print(f"  revisits handed a lesson: {handed} of {int(revisit.get('episodes/guided', 0))} "
          f"guided episodes; those lessons win replayed without a model: "
          f"{format_rate(report['lessons_win_replayed'], handed)}; bank: "
          f"{int(revisit.get('bank/size', 0))} entries")
    (args.out / "revisit_check.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
