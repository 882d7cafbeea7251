"""``crl demo``: the main job on the embedded default.

1. Plays every registered env that this machine can run with its scripted oracle (``crl eval
   --agent scripted``) and prints the results table; an env whose data or Docker daemon is
   missing is listed as skipped with the reason.
2. Trains the embedded default (SmolLM2-135M, actor and extractor) with Complementary RL on the
   ``cpu-demo`` config (``crl train cpu-demo``: minutes on a CPU, not a result).
3. Evaluates the trained actor, with the bank it grew, on the env it trained on.

``--no-train`` stops after step 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_envs.errors import UserFacingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=5, help="episodes per env (default 5)")
    parser.add_argument("--envs", default="all", help="comma-separated env ids (default: all)")
    parser.add_argument("--out", default=None, help="output folder (default runs/demo-TIMESTAMP)")
    parser.add_argument("--no-train", action="store_true",
                        help="only the scripted table: skip cpu-demo training and its evaluation")
    parser.add_argument("--eval-episodes", type=int, default=4,
                        help="episodes of the trained actor's evaluation (default 4)")


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
    status = eval_command.run(parser.parse_args(eval_args))
    if status or args.no_train:
        return status
    return train_and_evaluate(args.eval_episodes)


def train_and_evaluate(episodes: int) -> int:
    """``crl train cpu-demo``, then ``crl eval`` of its last actor checkpoint with its bank."""
    from crl_harness.commands import eval as eval_command
    from crl_harness.commands import train as train_command
    from crl_harness.config import load_config

    print("\nTraining SmolLM2-135M with Complementary RL (crl train cpu-demo) ...")
    parser = argparse.ArgumentParser(prog="crl demo")
    train_command.add_arguments(parser)
    status = train_command.run(parser.parse_args(["cpu-demo"]))
    if status:
        return status
    cfg = load_config("cpu-demo")
    run_dir = Path(cfg.run.output_dir)
    actor = sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "actor_hf"
    env_id = cfg.tasks.envs[0].id
    print(f"\nEvaluating the trained actor ({actor}) with its bank on {env_id} ...")
    parser = argparse.ArgumentParser(prog="crl demo")
    eval_command.add_arguments(parser)
    return eval_command.run(parser.parse_args([
        "--agent", f"hf:{actor}", "--envs", env_id, "--episodes", str(episodes),
        "--experience", str(run_dir / "bank.sqlite"), "--temperature", "0",
        "--max-new-tokens", str(cfg.actor.max_new_tokens),
        *(["--history", str(cfg.actor.history)] if cfg.actor.history is not None else []),
        "--out", str(run_dir / "eval")]))
