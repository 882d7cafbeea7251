"""``crl warmstart CONFIG [key=value ...]``: supervised warm start on scripted-oracle episodes.

Trains LoRA adapters for the actor and the extractor of CONFIG (``warmstart.*`` settings, the
envs of ``tasks.envs``, the prompts of ``actor.history``) and writes them to
``warmstart.output_dir`` (default ``RUN_DIR/warmstart``); start training from them with
``actor.model=hf:OUT/actor extractor.model=hf:OUT/extractor``, or evaluate with
``crl eval --agent hf:OUT/actor``. Re-running replaces the adapters atomically;
``--only extractor`` (or ``actor``) trains and replaces that one alone.
"""

from __future__ import annotations

import argparse
import sys

from crl_harness.commands.checks import output_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML file, or a name under assets/configs (e.g. cpu-demo)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="settings to override, e.g. warmstart.episodes=40")
    parser.add_argument("--only", choices=("actor", "extractor"), default=None,
                        help="train and write this adapter alone; the other one and its record "
                             "in metrics.json stay as they are")


def run(args: argparse.Namespace) -> int:
    from crl_harness.config import ConfigError, check_lora_fits, load_config

    try:
        cfg = load_config(args.config, list(args.overrides))
        check_lora_fits(cfg, ("warmstart",))
    except ConfigError as err:
        print(f"crl warmstart: {err}", file=sys.stderr)
        return 2
    output_dir(cfg.warmstart.output_dir, "warmstart.output_dir")  # before any model loads
    from crl_harness.warmstart import run_warmstart

    run_warmstart(cfg, only=args.only)
    return 0
