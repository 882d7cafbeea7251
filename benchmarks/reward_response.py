"""How far one GRPO step moves the actor: the trainer's own loop, with the env's reward replaced
by a behaviour that is easy to count, the share of an episode's turns that play ``--action``.

    .venv/bin/python benchmarks/reward_response.py                       # cpu-demo, lr 1e-5
    .venv/bin/python benchmarks/reward_response.py --set actor.lr=1e-6   # the released lr
    .venv/bin/python benchmarks/reward_response.py --lora --dtype bfloat16 --lr 1e-4 3e-4 1e-3

A fresh ``Trainer`` of ``--config`` (default ``cpu-demo``: the shipped warm-started actor) plays
``--episodes`` episodes a step on new levels of ``--turns`` turns, greedy nowhere (the training
temperature), arm ``none``, no warm-up. Before each update it prints the rewarded share of the
actions sampled, the share of replies that broke the answer format, and the most played actions.
A working update raises the share at once; how much it moves per step, and whether the replies
stay well-formed, says what a step of that learning rate does to the policy at this batch size.

``--lora [DIR]`` trains LoRA adapters continued from DIR (default: the config's ``actor.model``
when it is an adapter folder, as cpu-demo's warm start is) on their base model
(``actor.lora.init_from``), instead of the merged model in full; ``--dtype`` sets
``actor.dtype``; ``--lr`` a sweep, one fresh run per learning rate (``OUT/lr-LR``), each line
tagged with its ``lr`` and a summary at the end.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time


def main() -> None:
    from crl_harness.quiet import quiet_third_party

    quiet_third_party()  # as crl's commands (HF_HUB_DISABLE_PROGRESS_BARS=0 shows the bars)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--action", default="north", help="the rewarded action")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=16, help="episodes a step (groups of 4)")
    parser.add_argument("--turns", type=int, default=3, help="max_episode_steps of the task")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="key=value",
                        help="more config overrides (e.g. actor.lr=1e-6)")
    parser.add_argument("--out", default=None,
                        help="a new run directory (default runs/reward-response-TIMESTAMP)")
    parser.add_argument("--lora", nargs="?", const="", default=None, metavar="DIR",
                        help="train LoRA adapters continued from DIR (default: the config's "
                             "actor.model adapter folder) on their base")
    parser.add_argument("--dtype", default=None, help="actor.dtype (e.g. bfloat16)")
    parser.add_argument("--lr", nargs="+", type=float, default=None,
                        help="actor learning rates, one fresh run each (a sweep)")
    args = parser.parse_args()
    if args.episodes % 4 or not 1 <= args.steps <= 100 or not 1 <= args.turns <= 30:
        parser.error("--episodes must be a multiple of 4, --steps 1-100, --turns 1-30")
    if args.lr is not None and not all(0 < lr <= 1 for lr in args.lr):
        parser.error("--lr values must be in (0, 1]")

    from crl_harness.config import ConfigError, load_config

    out = args.out or time.strftime("runs/reward-response-%Y%m%d-%H%M%S")
    overrides = [
        "arm=none", f"run.steps={args.steps}", "run.checkpoint_every=1000000",
        "run.tensorboard=false", "actor.warmup_steps=0", "tasks.group_size=4",
        f"tasks.groups_per_step={args.episodes // 4}", "tasks.seed_count=1000000", *args.set]
    try:
        if args.lora is not None:
            overrides += _lora_overrides(args.lora or load_config(args.config, overrides).starting_model())
        if args.dtype is not None:
            overrides.append(f"actor.dtype={args.dtype}")
        runs = [(None, out, overrides)] if args.lr is None else [
            (lr, f"{out}/lr-{lr:g}", [*overrides, f"actor.lr={lr}"]) for lr in args.lr]
        configs = [(lr, load_config(args.config, [*o, f"run.output_dir={d}"]))
                   for lr, d, o in runs]
    except (ConfigError, ValueError) as err:
        parser.error(str(err))
    summary = [_respond(args, cfg, lr) for lr, cfg in configs]
    if args.lr is not None:
        print(json.dumps({"sweep": summary}), flush=True)


def _lora_overrides(adapter_spec: str) -> list[str]:
    """``actor.model`` the adapters' base and ``actor.lora.init_from`` the adapters."""
    from pathlib import Path

    from crl_harness.models.model_folder import adapter_base, is_adapter_folder
    from crl_harness.models.names import resolve_model_path

    adapter = adapter_spec.removeprefix("hf:")
    if not is_adapter_folder(Path(resolve_model_path(adapter)).expanduser()):
        raise ValueError(f"--lora: {adapter} is not a LoRA adapter folder; give one "
                         "(e.g. --lora assets/warmstart/cpu-demo/actor)")
    base = adapter_base(Path(resolve_model_path(adapter)).expanduser())
    return [f"actor.model=hf:{base}", "actor.lora.enabled=true",
            f"actor.lora.init_from={adapter}"]


def _respond(args: argparse.Namespace, cfg, lr: float | None) -> dict:
    """One fresh run of ``cfg`` whose reward is the share of ``--action``; its per-step lines
    printed, its first and last share and worst format-failure rate returned."""
    from crl_harness.training.trainer import Trainer

    for entry in cfg.tasks.envs:
        entry.kwargs["max_episode_steps"] = args.turns
    trainer = Trainer(cfg)
    play = trainer.rollouts.run
    step = 0
    shares: list[float] = []
    failures: list[float] = []

    def play_and_reward(specs):
        nonlocal step
        step += 1
        played, rewarded, actions, broken, turns = play(specs), [], collections.Counter(), 0, 0
        for t in played:
            hits = sum(turn.action == args.action for turn in t.turns)
            rewarded.append(dataclasses.replace(t, reward=hits / max(len(t.turns), 1)))
            actions.update(turn.action or "(format failure)" for turn in t.turns)
            broken += sum(not turn.format_ok for turn in t.turns)
            turns += len(t.turns)
        shares.append(round(actions[args.action] / max(turns, 1), 3))
        failures.append(round(broken / max(turns, 1), 3))
        line = {"step": step, "share": shares[-1], "format_failures": failures[-1],
                "turns": turns, "top_actions": actions.most_common(5)}
        print(json.dumps(line if lr is None else {"lr": lr, **line}), flush=True)
        return rewarded

    trainer.rollouts.run = play_and_reward
    lora = f", LoRA from {cfg.actor.lora.init_from}" if cfg.actor.lora.init_from else ""
    print(f"{args.config}: actor lr {cfg.actor.lr} ({cfg.actor.model}, dtype {cfg.actor.dtype}"
          f"{lora}), {args.episodes} episodes a step, reward = share of turns playing "
          f"{args.action!r}", flush=True)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    print(f"{args.steps} steps in {seconds:.0f} s", flush=True)
    return {"lr": cfg.actor.lr, "first_share": shares[0] if shares else None,
            "last_share": shares[-1] if shares else None,
            "max_format_failures": max(failures, default=None), "seconds": round(seconds)}


if __name__ == "__main__":
    main()
