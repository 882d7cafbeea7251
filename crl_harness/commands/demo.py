"""``crl demo``: the main job on the embedded default, into a fresh ``runs/demo-TIMESTAMP``.

``--config NAME`` (default ``cpu-demo``; a YAML path or a name under ``assets/configs``, e.g.
``mix3-cpu``) picks the training config of steps 2-4; a mixture is evaluated on each of its envs.

1. Plays every registered env that this machine can run with its scripted oracle (``crl eval
   --agent scripted``, into ``OUT/scripted``) and prints the results table; an env whose data or
   Docker daemon is missing is listed as skipped with the reason.
2. Evaluates the warm-started actor (``assets/warmstart/cpu-demo``, or ``crl warmstart cpu-demo``
   when absent; ``warmstart.output_dir`` and ``crl warmstart NAME`` of another config) greedily on
   ``--eval-levels`` held-out levels and on the training levels of each env of the config, one
   episode a level (cached: free the second time).
3. Trains SmolLM2-135M, actor and extractor, with Complementary RL (``crl train cpu-demo`` into
   ``OUT/cpu-demo``; ``OUT/NAME`` for another config).
4. Evaluates the checkpoint that this training returned on the same levels (the training levels
   with the bank it grew; the held-out levels also with it, paired against without), and prints before and after, each rate with its 95% interval, their
   paired difference with its 95% interval and McNemar's exact p (a mixture: a line per env and
   level set, and the pooled pairs), the bank's size, the updates and the learning curve. Every
   level's outcome is in ``OUT/levels.json``.

``--no-train`` stops after step 1.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_envs.errors import UserFacingError, describe_error
from crl_envs.swebench.sandbox.base import UnisolatedSandboxWarning

HELDOUT_WITH_BANK = "held-out, with its bank"
"""the case of the trained actor on the held-out levels with the run's bank"""

MAX_TEST_TIME_ROUNDS = 8
"""``--test-time-rounds``' bound: each round starts a trainer and three engines of its own"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=5, help="episodes per env (default 5)")
    parser.add_argument("--envs", default="all", help="comma-separated env ids (default: all)")
    parser.add_argument("--out", default=None,
                        help="a new output folder (default runs/demo-TIMESTAMP)")
    parser.add_argument("--no-train", action="store_true",
                        help="only the scripted table: skip the training and its evaluation")
    parser.add_argument("--config", default="cpu-demo",
                        help="the training config, a YAML path or a name under assets/configs "
                             "(default cpu-demo; e.g. mix3-cpu: each env evaluated apart)")
    parser.add_argument("--eval-levels", type=int, default=96,
                        help="held-out levels of the before/after evaluation, one greedy episode "
                             "each (default 96: about 80%% power for +15 points, paired by level)")
    parser.add_argument("--test-time-levels", type=int, default=32,
                        help="unseen levels of the test-time experience check (attempt 1: 4 "
                             "sampled episodes distilled into a fresh bank; attempt 2: greedy "
                             "with it against without it, paired; default 32; 0: skip)")
    parser.add_argument("--test-time-rounds", type=int, default=1,
                        help="at most this many unseen levels of one retrieval key, each in a "
                             "round with a fresh bank of its own (1..8; default 1: the 32 default "
                             "levels hold 21 dark starts, against 22 with 3, in one round)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="settings of the training config, as crl train takes them (e.g. "
                             "actor.rollout_engine=vllm extractor.rollout_engine=vllm)")


def runnable_envs(env_ids: list[str]) -> list[str]:
    """The ids that make and reset here; the others are printed with the reason."""
    ok = []
    for env_id in env_ids:
        try:
            env = gym.make(env_id)
            try:
                env.reset(seed=0)
            finally:
                env.close()
        except UserFacingError as err:
            print(f"skipping {env_id}: {err}")
            continue
        except ImportError as err:  # an extra this machine lacks (swebench, webshop, alfworld)
            print(f"skipping {env_id}: {describe_error(err)}")
            continue
        ok.append(env_id)
    return ok


def run(args: argparse.Namespace) -> int:
    from crl_harness.commands import eval as eval_command
    from crl_harness.commands.checks import check_range, output_dir
    from crl_harness.config import HELDOUT_RESERVED, ConfigError, load_config
    from crl_harness.eval import MAX_EPISODES, expand_env_ids
    from crl_harness.training.run_directory import occupied

    check_range("--episodes", args.episodes, 1, MAX_EPISODES)
    check_range("--eval-levels", args.eval_levels, 1, HELDOUT_RESERVED)
    check_range("--test-time-levels", args.test_time_levels, 0, HELDOUT_RESERVED)
    check_range("--test-time-rounds", args.test_time_rounds, 1, MAX_TEST_TIME_ROUNDS)
    out = Path(args.out or f"runs/demo-{time.strftime('%Y%m%d-%H%M%S')}")
    try:  # OUT/NAME: the config's own name (run.output_dir's default is runs/${name})
        cfg = load_config(args.config, [*args.overrides, f"run.output_dir={out}/${{name}}"])
    except ConfigError as err:
        raise UserFacingError(f"--config{' and its settings' if args.overrides else ''}: "
                              f"{err}") from err
    if not args.no_train and occupied(cfg.run.output_dir):
        raise UserFacingError(f"--out {out} holds an earlier demo's run; give a new --out (by "
                              "default each demo writes a fresh runs/demo-TIMESTAMP).")
    output_dir(out, "--out")
    with warnings.catch_warnings():
        # the envs' own scripted oracles play here, no untrusted agent: SWE-bench's toy task on
        # a LocalSandbox warns about those in vain
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        env_ids = runnable_envs(expand_env_ids(args.envs))
        eval_args = ["--agent", "scripted", "--envs", ",".join(env_ids),
                     "--episodes", str(args.episodes), "--out", str(out / "scripted")]
        parser = argparse.ArgumentParser(prog="crl demo")
        eval_command.add_arguments(parser)
        status = eval_command.run(parser.parse_args(eval_args))
    if status or args.no_train:
        return status
    train_and_evaluate(cfg, args.eval_levels, out, test_time_levels=args.test_time_levels,
                       test_time_rounds=args.test_time_rounds)
    return 0


def train_and_evaluate(cfg: Any, levels: int, out: Path, cache: Path | None = None,
                       test_time_levels: int = 0, test_time_rounds: int = 1) -> Path:
    """The warm start (shipped, or ``crl warmstart`` when absent) on ``levels`` held-out levels
    and on the training levels (cached in ``cache``, default ``default_cache()``), training
    ``cfg`` into ``cfg.run.output_dir``, and the checkpoint that training returns on the same
    levels (the training levels with the bank it grew), and, on ``test_time_levels`` unseen
    levels (at most ``test_time_rounds`` of a retrieval key), the trained actor's second attempt
    with a bank its extractor wrote from its first against one without
    (``test_time_experience``); prints them with their paired differences
    and writes every level's outcome to ``out/levels.json``. Returns that checkpoint."""
    from crl_harness.commands import train as train_command
    from crl_harness.eval.heldout import (
        default_cache,
        env_cases,
        evaluate_levels,
        handed_lessons,
        handed_line,
        paired,
    )
    from crl_harness.models.names import resolve_model_path
    from crl_harness.warmstart import run_warmstart

    run_dir = Path(cfg.run.output_dir)
    if not Path(resolve_model_path(cfg.starting_model().removeprefix("hf:"))).exists():
        print(f"\nWarm start (crl warmstart {cfg.name}) ...")
        run_warmstart(cfg)
    # Both evaluations in the weights training samples with, before and after alike, so the
    # paired difference is fair.
    dtype = cfg.actor.dtype
    t = cfg.tasks
    heldout = list(range(t.heldout_offset, t.heldout_offset + levels))
    training = list(t.training_seeds()[:levels])
    envs = "" if len(t.envs) == 1 else f" of each of its {len(t.envs)} envs"
    print(f"\nEvaluating the warm-started actor ({cfg.starting_model()}) on {len(heldout)} held-out "
          f"and {len(training)} training levels{envs}, greedy, weights in {dtype} (cached after "
          "the first time) ...")
    before = evaluate_levels(cfg, cfg.starting_model(),
                             env_cases(cfg, {"held-out": (heldout, False),
                                             "training": (training, False)}),
                             out / "eval-before", cache=cache or default_cache(), dtype=dtype)

    print(f"\nTraining with Complementary RL ({cfg.name}) into {run_dir} ...")
    checkpoint = train_command.train(cfg)
    actor = checkpoint / "actor_hf"
    with_bank = cfg.uses_experience
    print(f"\nEvaluating the trained actor ({actor}) on the held-out levels"
          f"{' without and with its bank' if with_bank else ''} and on the training levels"
          f"{' with its bank' if with_bank else ''} ...")
    # Held-out levels without the bank, as before training; with it, the question a user asks
    # (do the lessons of the training levels lift levels never played? only lessons that hold
    # for a retrieval key can); the training levels with the bank, the method's own setting.
    cases = {"held-out": (heldout, False), "training": (training, with_bank)}
    if with_bank:
        cases[HELDOUT_WITH_BANK] = (heldout, True)
    after = evaluate_levels(cfg, f"hf:{actor}", env_cases(cfg, cases), out / "eval-after",
                            bank=run_dir / "bank.sqlite", dtype=dtype)
    differences = {name: paired(before[name], after[name]) for name in before}
    # the same trained actor on the same held-out levels: with its bank - without
    bank_effect = {name: paired(after[name], after[name.replace("held-out", HELDOUT_WITH_BANK)])
                   for name in before if with_bank and name.startswith("held-out")}
    # where the bank acted on those levels, and whether its lessons win them replayed
    handed = {name: handed_lessons(out / "eval-after" / name.replace("held-out", HELDOUT_WITH_BANK)
                                   / "report.json") for name in bank_effect}
    test_time = None
    if test_time_levels and cfg.uses_experience:
        from crl_harness.training.unseen import test_time_experience, unseen_levels

        extractor = checkpoint / "extractor_hf"
        extractor_spec = f"hf:{extractor}" if extractor.exists() else \
            cfg.starting_model("extractor")
        print(f"\nTest-time experience on {test_time_levels} unseen levels: 4 sampled attempts "
              "a level distilled into a fresh bank, then greedy with it against without it ...")
        attempts = test_time_experience(cfg, actor=f"hf:{actor}", extractor=extractor_spec,
                                        seeds=unseen_levels(test_time_levels, cfg=cfg,
                                                            per_key=test_time_rounds),
                                        out=out / "test-time", dtype=dtype)
        test_time = paired(attempts["free"], attempts["guided"])
    levels_json = {
        "actor_before": cfg.starting_model(), "actor_after": str(actor),
        "levels": {name: {"before": before[name], "after": after[name],
                          "paired": differences[name].to_dict()} for name in before},
    }
    for name, d in bank_effect.items():
        levels_json["levels"][name]["after_with_bank"] = \
            after[name.replace("held-out", HELDOUT_WITH_BANK)]
        levels_json["levels"][name]["with_bank_paired"] = d.to_dict()
        levels_json["levels"][name]["handed_lessons"] = {str(s): w for s, w in handed[name].items()}
    if test_time is not None:
        levels_json["test_time"] = {"free": attempts["free"], "guided": attempts["guided"],
                                    "paired": test_time.to_dict()}
    pooled_differences = _pooled(cfg, differences)
    if pooled_differences:  # a mixture: every env's pairs of a level set counted together
        levels_json["pooled"] = {name: d.to_dict() for name, d in pooled_differences.items()}
    (out / "levels.json").write_text(json.dumps(levels_json, indent=2))
    _print_summary(cfg, run_dir, differences | {f"{name}, pooled": d
                                               for name, d in pooled_differences.items()},
                   test_time, {name: (d, handed[name] and handed_line(
                       handed[name], after[name],
                       after[name.replace("held-out", HELDOUT_WITH_BANK)]))
                       for name, d in bank_effect.items()})
    return checkpoint


def _pooled(cfg: Any, differences: dict[str, Any]) -> dict[str, Any]:
    """For a mixture, each level set's paired differences (``NAME/ENV``) pooled over the envs
    (``heldout.pooled``); nothing for one env."""
    from crl_harness.eval.heldout import pooled

    if len(cfg.tasks.envs) == 1:
        return {}
    sets: dict[str, list[Any]] = {}
    for name, d in differences.items():
        sets.setdefault(name.split("/")[0], []).append(d)
    return {name: pooled(ds) for name, ds in sets.items()}


def _print_summary(cfg: Any, run_dir: Path, differences: dict[str, Any],
                   test_time: Any = None, bank_effect: dict[str, Any] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from crl_harness.eval import format_paired, format_rate
    from crl_harness.training.metrics import PAIR_SETS, pooled_pairs

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    envs = cfg.tasks.envs
    what = f"{envs[0].id} {dict(envs[0].kwargs)}" if len(envs) == 1 else \
        f"{cfg.name} ({', '.join(e.id for e in envs)})"
    table = Table(title=f"crl demo: {what}, greedy, one episode a level; success [95% Wilson "
                        "interval]")
    for column in ("levels", "warm start", "after training", "after - before, paired [95% CI]"):
        table.add_column(column)
    for name, d in differences.items():  # held-out, training; a mixture: NAME/ENV, NAME, pooled
        label = f"{name} (after: with its bank)" if name.startswith("training") else name
        table.add_row(label, format_rate(d.a_wins, d.n),
                      format_rate(d.b_wins, d.n), format_paired(d, "before", "after"))
    console = Console()
    console.print(table)
    # Where experience acts: guided - free inside the training groups, on levels an earlier step
    # played (the bank may hold their lesson) and on levels played first (it cannot).
    pairs = Table(title="guided - free inside the training groups, steps pooled [paired 95% CI]")
    for column in ("groups", "pairs", "guided", "free", "guided - free"):
        pairs.add_column(column)
    for where, prefix in PAIR_SETS.items():
        d = pooled_pairs(metrics, prefix)
        pairs.add_row(where, str(d.n), format_rate(d.b_wins, d.n), format_rate(d.a_wins, d.n),
                      format_paired(d, "free", "guided"))
    console.print(pairs)
    for name, (d, handed) in (bank_effect or {}).items():
        console.print(f"{name} levels, the trained actor with the run's bank: "
                      f"{format_rate(d.b_wins, d.n)}, without: {format_rate(d.a_wins, d.n)}; "
                      f"with - without {format_paired(d, 'without', 'with')}"
                      + (f"; {handed}" if handed else ""))
    if test_time is not None:
        d = test_time
        console.print(f"unseen levels, second attempt (greedy) with the bank the first attempt "
                      f"wrote: {format_rate(d.b_wins, d.n)}, without: {format_rate(d.a_wins, d.n)}; "
                      f"with - without {format_paired(d, 'without', 'with')}")
    handed = [(m["lessons/handed"], m["lessons/replay_win_rate"]) for m in metrics
              if m.get("lessons/handed")]
    if handed:
        wins = round(sum(n * rate for n, rate in handed))
        console.print(f"lessons handed to guided episodes that win when replayed without a "
                      f"model: {format_rate(wins, round(sum(n for n, _ in handed)))}")
    last = metrics[-1] if metrics else {}
    curve = ", ".join(f"{m.get('success/all', float('nan')):.2f}" for m in metrics)
    console.print(
        f"bank: {int(last.get('bank/size', 0))} entries; actor updates: "
        f"{sum(1 for m in metrics if m.get('grad_norm/actor', 0) > 0)}; extractor: "
        f"{int(last.get('extractor/generations_rewarded', 0))} generations credited, "
        f"{int(last.get('extractor/nonzero_advantages', 0))} of them with a non-zero advantage "
        f"(equal credits cancel), updates: {int(last.get('extractor/updates', 0))}; training "
        "success per step: "
        f"{curve}")
    if len(envs) > 1:  # a step draws its groups' envs by weight: an env it missed is "-"
        from crl_harness.training.metrics import short_env_name

        names = dict.fromkeys(short_env_name(e.id) for e in envs)
        console.print("training success per step and env: " + "; ".join(
            f"{env} " + ", ".join(f"{m[f'success/{env}']:.2f}" if f"success/{env}" in m else "-"
                                  for m in metrics) for env in names))
    console.print(f"learning curve: {run_dir / 'learning_curve.png'}; metrics: "
                  f"{run_dir / 'metrics.jsonl'}")
