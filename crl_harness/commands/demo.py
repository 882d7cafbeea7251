"""``crl demo``: the main job on the embedded default.

Plays every registered env that this machine can run with its scripted oracle (``crl eval
--agent scripted``) and prints the results table; an env whose data or Docker daemon is missing
is listed as skipped with the reason.
"""

from __future__ import annotations

import argparse

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_envs.errors import UserFacingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=5, help="episodes per env (default 5)")
    parser.add_argument("--envs", default="all", help="comma-separated env ids (default: all)")
    parser.add_argument("--out", default=None, help="output folder (default runs/demo-TIMESTAMP)")


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
    from crl_harness.eval import expand_env_ids

    env_ids = runnable_envs(expand_env_ids(args.envs))
    eval_args = ["--agent", "scripted", "--envs", ",".join(env_ids),
                 "--episodes", str(args.episodes)]
    if args.out:
        eval_args += ["--out", args.out]
    parser = argparse.ArgumentParser(prog="crl demo")
    eval_command.add_arguments(parser)
    return eval_command.run(parser.parse_args(eval_args))
