"""Test-time experience on unseen levels (M-c): the second attempt at a level with the bank the
first attempt's episodes were distilled into, against the same attempt without it.

    .venv/bin/python benchmarks/test_time_check.py                      # cpu-demo's warm start
    .venv/bin/python benchmarks/test_time_check.py --levels 64 --actor hf:RUN/checkpoints/step-000008/actor_hf \
        --extractor hf:RUN/checkpoints/step-000008/extractor_hf

On ``--levels`` unseen levels (``crl_harness.training.unseen.unseen_levels``: no training
pool, warm-start or held-out level; at most ``ROUNDS`` of a retrieval key, each in a round with
a bank of its own), attempt 1: the actor (frozen) plays each level
``--attempts`` times at its training temperature and the extractor distils them into a fresh bank
as training does (a level's shortest win; a level never won gets no lesson); attempt 2: one
greedy episode a level with that bank and one without, paired level by level (95% interval,
McNemar's p). Defaults: the config's warm-started actor and extractor. Outcomes and the bank are
under ``--out``.
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
    parser.add_argument("--levels", type=int, default=64, help="unseen levels (2..4096)")
    parser.add_argument("--attempts", type=int, default=4,
                        help="sampled episodes a level in attempt 1 (2..16)")
    parser.add_argument("--actor", help="hf: spec (default: the config's warm-started actor)")
    parser.add_argument("--extractor",
                        help="hf: spec (default: the config's warm-started extractor)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="at most this many levels of a retrieval key, each in a round of "
                             "its own (1..8; default unseen.ROUNDS, 3)")
    parser.add_argument("--out", type=Path, default=Path("runs/test-time-check"))
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides, e.g. actor.rollout_engine=vllm")
    args = parser.parse_args()
    if not 2 <= args.levels <= 4096:
        parser.error("--levels must be in 2..4096")
    if not 2 <= args.attempts <= 16:
        parser.error("--attempts must be in 2..16")
    if args.rounds is not None and not 1 <= args.rounds <= 8:
        parser.error("--rounds must be in 1..8")

    from crl_harness.config import ConfigError, load_config
    from crl_harness.eval import format_paired, format_rate
    from crl_harness.eval.heldout import paired
    from crl_harness.training.unseen import ROUNDS, test_time_experience, unseen_levels

    try:
        cfg = load_config(args.config, args.set)
    except ConfigError as err:
        parser.error(str(err))
    actor = args.actor or cfg.starting_model("actor")
    extractor = args.extractor or cfg.starting_model("extractor")
    rounds = args.rounds or ROUNDS
    started = time.perf_counter()
    outcomes = test_time_experience(cfg, actor=actor, extractor=extractor,
                                    seeds=unseen_levels(args.levels, cfg=cfg, per_key=rounds),
                                    out=args.out,
                                    attempts=args.attempts, dtype=cfg.actor.dtype)
    seconds = time.perf_counter() - started
    d = paired(outcomes["free"], outcomes["guided"])
    print(f"\n{d.n} unseen levels of {cfg.tasks.envs[0].id}, {args.attempts} sampled attempts "
          f"a level distilled, at most {rounds} a retrieval key, then greedy ({seconds:.0f} "
          f"s): with the bank "
          f"{format_rate(d.b_wins, d.n)}, without {format_rate(d.a_wins, d.n)}; with - without "
          f"{format_paired(d, 'without', 'with')}")
    (args.out / "test_time_check.json").write_text(json.dumps({
        "actor": actor, "extractor": extractor, "levels": args.levels,
        "attempts": args.attempts, "rounds": rounds, "seconds": seconds, "paired": d.to_dict(),
        "overrides": args.set}, indent=2))


if __name__ == "__main__":
    main()
