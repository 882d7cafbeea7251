"""``crl train CONFIG [key=value ...]``: Complementary RL training (or a baseline arm).

CONFIG is a YAML path or a name under ``assets/configs`` (``cpu-demo``, ``mix3``, ...); each
``key=value`` overrides one setting (``arm=none``, ``run.steps=20``, ``tasks.envs.0.weight=2``).
Metrics go to ``RUN_DIR/metrics.jsonl`` and TensorBoard, the curve to
``RUN_DIR/learning_curve.png``. A run directory holds one run: a fresh run into one that holds
another is refused, naming ``--resume`` (continue that run from its latest checkpoint) and
``--overwrite`` (delete it and start over). ``--dry-run`` checks the models, data and env kwargs
and prints the plan (``crl_harness.commands.dry_run``), training nothing. ``train`` is the same as a function that returns the
run's final checkpoint (``crl demo`` evaluates it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crl_harness.commands.checks import output_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML file, or a name under assets/configs (e.g. cpu-demo)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="settings to override, e.g. arm=none run.steps=10")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in run.output_dir from its latest checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete the run that run.output_dir holds, then start a fresh one")
    parser.add_argument("--backend", choices=["local", "ray"], default=None,
                        help="where training runs (one process, or Ray actors): "
                             "shorthand for run.backend=...")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--report-to", nargs="+", default=[], choices=["wandb", "mlflow"],
                        metavar="SERVICE",
                        help="also log each step's metrics to wandb and/or mlflow (the tracking "
                             "extra; configured by their own WANDB_* / MLFLOW_* variables)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check models, data and env kwargs and print the plan (envs, "
                             "episodes and tokens per step, memory, checkpoint size); train "
                             "nothing")


def run(args: argparse.Namespace) -> int:
    from crl_envs.errors import UserFacingError
    from crl_harness.config import (
        ConfigError,
        check_context_fits,
        check_lora_fits,
        load_config,
    )

    if args.resume and args.overwrite:
        raise UserFacingError("--resume continues the run and --overwrite deletes it; give one.")
    overrides = list(args.overrides)
    if args.backend:
        overrides.append(f"run.backend={args.backend}")
    try:
        cfg = load_config(args.config, overrides)
        check_lora_fits(cfg, ("actor", "extractor"))
        check_context_fits(cfg)
    except ConfigError as err:
        print(f"crl train: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        from crl_harness.commands.dry_run import DryRunError, dry_run

        try:
            dry_run(cfg)
        except DryRunError as err:
            for problem in err.problems:
                print(f"crl train --dry-run: {problem}", file=sys.stderr)
            return 2
        return 0
    train(cfg, resume=args.resume, overwrite=args.overwrite, progress=not args.no_progress,
          report_to=args.report_to)
    print(f"Run directory: {cfg.run.output_dir} (metrics.jsonl, learning_curve.png, "
          f"checkpoints/, tensorboard/)")
    return 0


def make_trainer(cfg: Any, **kwargs: Any) -> Any:
    """The trainer for ``cfg``, handed the placement ``cfg.run.backend`` names: this process
    (``local``, ``LocalPlacement``) or Ray actors (``ray``, ``RayPlacement``). Chosen here, by
    the command: the trainer imports no Ray code, and the Ray placement no trainer."""
    from crl_harness.training.trainer import Trainer

    if cfg.run.backend == "ray":
        from crl_harness.training.ray_backend import RayPlacement

        return Trainer(cfg, placement=RayPlacement(cfg), **kwargs)
    return Trainer(cfg, **kwargs)


def train(cfg: Any, *, resume: bool = False, overwrite: bool = False,
          progress: bool = True, report_to: Sequence[str] = ()) -> Path:
    """Train ``cfg`` (a ``TrainConfig``) with a progress bar, each step's metrics also to the
    services of ``report_to`` (``crl_harness.tracking``); returns the checkpoint of its final
    step. A run directory that cannot be used is one ``UserFacingError``, before models load."""
    output_dir(cfg.run.output_dir, "run.output_dir")
    from tqdm import tqdm

    from crl_harness.config import config_to_dict
    from crl_harness.tracking import Trackers, check_services, open_trackers

    check_services(report_to)  # a missing package is one line before any model loads

    bar = tqdm(total=cfg.run.steps, desc=f"{cfg.name} [{cfg.arm}]", unit="step",
               disable=not progress)

    def on_step(step: int, metrics: dict[str, float]) -> None:
        bar.n = step
        shown = {"success": metrics.get("success/all", float("nan")),
                 "reward": metrics.get("reward/all", float("nan"))}
        if "bank/size" in metrics:
            shown["bank"] = int(metrics["bank/size"])
        bar.set_postfix(shown)
        bar.refresh()
        trackers.log(step, metrics)

    trackers = Trackers([])
    trainer = make_trainer(cfg, resume=resume, overwrite=overwrite, on_step=on_step)
    # Opened once the trainer has made (or, with --overwrite, emptied) the run directory, which
    # a W&B run writes into; on_step reads this name when it runs.
    trackers = open_trackers(report_to, name=f"{cfg.name}-{cfg.arm}",
                             run_dir=Path(cfg.run.output_dir), config=config_to_dict(cfg))
    bar.n = trainer.step
    bar.refresh()
    try:
        trainer.train()
    finally:
        trackers.close()
    bar.close()
    # a resumed run with no step left saved nothing new: its latest checkpoint is its final one
    return trainer.last_checkpoint or trainer.checkpoints.latest()
