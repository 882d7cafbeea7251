"""How far one GRPO step moves the actor: the trainer's own loop, with the env's reward replaced
by a behaviour that is easy to count, the share of an episode's turns that play ``--action``.

    .venv/bin/python benchmarks/reward_response.py                       # cpu-demo, lr 1e-5
    .venv/bin/python benchmarks/reward_response.py --set actor.lr=1e-6   # the released lr

A fresh ``Trainer`` of ``--config`` (default ``cpu-demo``: the shipped warm-started actor) plays
``--episodes`` episodes a step on new levels of ``--turns`` turns, greedy nowhere (the training
temperature), arm ``none``, no warm-up. Before each update it prints the rewarded share of the
actions sampled, the share of replies that broke the answer format, and the most played actions.
A working update raises the share at once; how much it moves per step, and whether the replies
stay well-formed, says what a step of that learning rate does to the policy at this batch size.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu-demo")
    parser.add_argument("--action", default="north", help="the rewarded action")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=16, help="episodes a step (groups of 4)")
    parser.add_argument("--turns", type=int, default=3, help="max_episode_steps of the task")
    parser.add_argument("--set", nargs="*", default=[], metavar="key=value",
                        help="more config overrides (e.g. actor.lr=1e-6)")
    parser.add_argument("--out", default=None,
                        help="a new run directory (default runs/reward-response-TIMESTAMP)")
    args = parser.parse_args()
    if args.episodes % 4 or not 1 <= args.steps <= 100 or not 1 <= args.turns <= 30:
        parser.error("--episodes must be a multiple of 4, --steps 1-100, --turns 1-30")

    from crl_harness.config import load_config
    from crl_harness.trainer import Trainer

    cfg = load_config(args.config, [
        "arm=none", f"run.output_dir={args.out or time.strftime('runs/reward-response-%Y%m%d-%H%M%S')}", f"run.steps={args.steps}",
        "run.checkpoint_every=1000000", "run.tensorboard=false", "actor.warmup_steps=0",
        "tasks.group_size=4", f"tasks.groups_per_step={args.episodes // 4}",
        "tasks.seed_count=1000000", *args.set])
    for entry in cfg.tasks.envs:
        entry.kwargs["max_episode_steps"] = args.turns
    trainer = Trainer(cfg)
    play = trainer.rollouts.run
    step = 0

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
        print(json.dumps({
            "step": step, "share": round(actions[args.action] / max(turns, 1), 3),
            "format_failures": round(broken / max(turns, 1), 3), "turns": turns,
            "top_actions": actions.most_common(5)}), flush=True)
        return rewarded

    trainer.rollouts.run = play_and_reward
    print(f"{args.config}: actor lr {cfg.actor.lr}, {args.episodes} episodes a step, reward = "
          f"share of turns playing {args.action!r}", flush=True)
    start = time.perf_counter()
    trainer.train()
    print(f"{args.steps} steps in {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
