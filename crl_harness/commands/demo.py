"""``crl demo``: the main job on the embedded default.

1. Plays every registered env that this machine can run with its scripted oracle (``crl eval
   --agent scripted``) and prints the results table; an env whose data or Docker daemon is
   missing is listed as skipped with the reason.
2. Evaluates the warm-started actor (``assets/warmstart/cpu-demo``, or ``crl warmstart cpu-demo``
   when absent) on held-out and on training levels of the ``cpu-demo`` task.
3. Trains SmolLM2-135M, actor and extractor, with Complementary RL (``crl train cpu-demo``).
4. Evaluates the trained actor with the bank it grew on the same levels, and prints before and
   after with 95% intervals, the bank's size, the updates and the learning curve.

``--no-train`` stops after step 1.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_envs.errors import UserFacingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=5, help="episodes per env (default 5)")
    parser.add_argument("--envs", default="all", help="comma-separated env ids (default: all)")
    parser.add_argument("--out", default=None, help="output folder (default runs/demo-TIMESTAMP)")
    parser.add_argument("--no-train", action="store_true",
                        help="only the scripted table: skip cpu-demo training and its evaluation")
    parser.add_argument("--eval-episodes", type=int, default=8,
                        help="held-out episodes of the before/after evaluations (default 8; the "
                             "training tasks are evaluated too, at most 8)")


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
        ok.append(env_id)
    return ok


def run(args: argparse.Namespace) -> int:
    from crl_harness.commands import eval as eval_command
    from crl_harness.commands.checks import check_range
    from crl_harness.eval import MAX_EPISODES, expand_env_ids

    check_range("--episodes", args.episodes, 1, MAX_EPISODES)
    check_range("--eval-episodes", args.eval_episodes, 1, MAX_EPISODES)
    env_ids = runnable_envs(expand_env_ids(args.envs))
    eval_args = ["--agent", "scripted", "--envs", ",".join(env_ids),
                 "--episodes", str(args.episodes)]
    if args.out:
        eval_args += ["--out", args.out]
    parser = argparse.ArgumentParser(prog="crl demo")
    eval_command.add_arguments(parser)
    status = eval_command.run(parser.parse_args(eval_args))
    if status or args.no_train:
        return status
    return train_and_evaluate(args.eval_episodes)


def _evaluate(cfg: Any, actor: str, bank: Path | None,
              cases: dict[str, tuple[list[int], bool]], out: Path) -> dict[str, Any]:
    """Greedy episodes of ``actor`` on the config's env for every case (name: its seeds and
    whether its episodes retrieve from ``bank``), played as one batch (one model load): each
    case's summary (success with its 95% Wilson interval), and a report per case under ``out``."""
    from crl_harness.commands.eval import _RetrieveOnly
    from crl_harness.eval import episode_specs, evaluate, summarize, write_report
    from crl_harness.experience import ExperienceBank, ExperienceManager
    from crl_harness.rollout import RolloutConfig

    entry = cfg.tasks.envs[0]
    retriever = None
    if bank is not None and bank.exists():
        retriever = _RetrieveOnly(ExperienceManager(ExperienceBank(bank, read_only=True)))
    rollout = RolloutConfig(max_new_tokens=cfg.actor.max_new_tokens, temperature=0.0,
                            history=cfg.actor.history, experience_k=cfg.experience.k,
                            env_kwargs={entry.id: dict(entry.kwargs)})
    specs, case_of = [], []  # an episode's group id is its place here, so cases never mix
    for name, (seeds, with_bank) in cases.items():
        for spec in episode_specs([entry.id], seeds, with_bank and retriever is not None):
            specs.append(replace(spec, group_id=len(specs)))
            case_of.append(name)
    trajectories = evaluate(actor, specs, retriever=retriever, rollout=rollout)
    summaries = {}
    for name, (seeds, _) in cases.items():
        played = sorted((t for t in trajectories if case_of[t.group_id] == name),
                        key=lambda t: t.group_id)
        write_report(out / name / "report.json", played, meta={"agent": actor, "seeds": seeds})
        summaries[name] = summarize(played)[0]
    return summaries


def train_and_evaluate(episodes: int) -> int:
    """The warm start (shipped, or ``crl warmstart cpu-demo`` when absent), held-out and
    training-task success before, ``crl train cpu-demo``, the same evaluations after."""
    from crl_harness.commands import train as train_command
    from crl_harness.config import load_config
    from crl_harness.models.registry import resolve_model_path
    from crl_harness.warmstart import run_warmstart

    cfg = load_config("cpu-demo")
    run_dir = Path(cfg.run.output_dir)
    if not Path(resolve_model_path(cfg.actor.model.removeprefix("hf:"))).exists():
        print("\nWarm start (crl warmstart cpu-demo) ...")
        run_warmstart(cfg)
    t = cfg.tasks
    sets = {"held-out": list(range(t.heldout_offset, t.heldout_offset + episodes)),
            "training": list(range(t.seed_offset, t.seed_offset + min(t.seed_count, episodes)))}
    print(f"\nEvaluating the warm-started actor ({cfg.actor.model}) ...")
    before = _evaluate(cfg, cfg.actor.model, None,
                       {name: (seeds, False) for name, seeds in sets.items()},
                       run_dir / "eval-before")

    print("\nTraining with Complementary RL (crl train cpu-demo) ...")
    parser = argparse.ArgumentParser(prog="crl demo")
    train_command.add_arguments(parser)
    status = train_command.run(parser.parse_args(["cpu-demo"]))
    if status:
        return status
    actor = sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "actor_hf"
    print(f"\nEvaluating the trained actor ({actor}), on the training levels with its bank ...")
    bank = run_dir / "bank.sqlite"
    # Held-out levels alone, as before training (the bank holds lessons of the training levels
    # only); the training levels with the bank, the method's own setting.
    after = _evaluate(cfg, f"hf:{actor}", bank,
                      {"held-out": (sets["held-out"], False),
                       "training-bank": (sets["training"], True)},
                      run_dir / "eval-after")
    _print_summary(cfg, run_dir, before, after)
    return 0


def _print_summary(cfg: Any, run_dir: Path, before: dict, after: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    table = Table(title=f"crl demo: {cfg.tasks.envs[0].id} {dict(cfg.tasks.envs[0].kwargs)}, "
                        "greedy, success (95% Wilson interval)")
    for column in ("tasks", "episodes", "warm start", "after training",
                   "after training, with its bank"):
        table.add_column(column)

    def rate(summary: Any) -> str:
        if summary is None:
            return "-"
        return f"{summary.success_rate:.0%} [{summary.ci_low:.0%}, {summary.ci_high:.0%}]"

    for name in before:
        table.add_row(name, str(before[name].episodes), rate(before[name]),
                      rate(after.get(name)), rate(after.get(f"{name}-bank")))
    console = Console()
    console.print(table)
    last = metrics[-1] if metrics else {}
    curve = ", ".join(f"{m.get('success/all', float('nan')):.2f}" for m in metrics)
    console.print(
        f"bank: {int(last.get('bank/size', 0))} entries; actor updates: "
        f"{sum(1 for m in metrics if m.get('grad_norm/actor', 0) > 0)}; extractor updates: "
        f"{int(last.get('extractor/updates', 0))} (non-zero advantages: "
        f"{int(last.get('extractor/nonzero_advantages', 0))}); training success per step: "
        f"{curve}")
    console.print(f"learning curve: {run_dir / 'learning_curve.png'}; metrics: "
                  f"{run_dir / 'metrics.jsonl'}")
