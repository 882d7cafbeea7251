"""``crl demo``: the main job on the embedded default.

Plays every registered env with its scripted oracle and prints a results table.
"""

from __future__ import annotations

import argparse

import crl_envs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=5, help="episodes per env (default 5)")
    parser.add_argument("--envs", nargs="*", default=None, help="env ids (default: every id)")


def run(args: argparse.Namespace) -> int:
    from crl_harness.eval import evaluate_scripted_table

    evaluate_scripted_table(args.envs or crl_envs.ENV_IDS, episodes=args.episodes)
    return 0
