"""``crl play ENV_ID [--seed N]``: a person plays any registered env in the terminal.

Shows the instructions once, then each observation; reads one action per line. A bad action is
shown as the env's invalid-action message; ``:quit`` (or EOF / Ctrl-C) ends the session cleanly,
``:help`` reprints the instructions, ``:actions`` lists the admissible actions.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import gymnasium as gym

import crl_envs
from crl_envs.errors import UserFacingError
from crl_harness.commands.checks import check_range


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", help=f"one of: {', '.join(crl_envs.env_ids())}")
    parser.add_argument("--seed", type=int, default=None, help="episode seed (default: random)")
    parser.add_argument("--episodes", type=int, default=1, help="episodes to play (default 1)")


def play(env_id: str, seed: int | None = None, episodes: int = 1,
         stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> list[float]:
    """Play ``episodes`` episodes of ``env_id`` reading actions from ``stdin``; return the returns."""
    env = gym.make(env_id)
    returns: list[float] = []

    def say(text: str = "") -> None:
        stdout.write(text + "\n")
        stdout.flush()

    try:
        say(f"== {env_id} ==\n{env.unwrapped.instructions}\n(:help, :actions, :quit)")
        for episode in range(episodes):
            episode_seed = None if seed is None else seed + episode
            observation, info = env.reset(seed=episode_seed)
            say(f"\n-- episode {episode + 1}, seed {episode_seed} --\nTask: {info['task']}\n")
            say(observation)
            total, steps, done = 0.0, 0, False
            while not done:
                stdout.write("> ")
                stdout.flush()
                line = stdin.readline()
                if not line:  # EOF
                    say("\nBye.")
                    return returns
                action = line.rstrip("\n")
                if action.strip() == ":quit":
                    say("Bye.")
                    return returns
                if action.strip() == ":help":
                    say(env.unwrapped.instructions)
                    continue
                if action.strip() == ":actions":
                    say(", ".join(info.get("admissible_actions") or ["(free text)"]))
                    continue
                observation, reward, terminated, truncated, info = env.step(action)
                steps += 1
                total += float(reward)
                say(observation)
                validity = "" if info["action_valid"] else "  [invalid action: no-op]"
                say(f"[step {steps}  reward {reward:+.2f}  return {total:+.2f}]{validity}")
                done = terminated or truncated
            outcome = "WON" if info["won"] else ("out of steps" if truncated else "lost")
            say(f"Episode over: {outcome}, return {total:+.2f}, score {info['score']:.2f}")
            returns.append(total)
    except KeyboardInterrupt:
        say("\nBye.")
    finally:
        env.close()
    return returns


def run(args: argparse.Namespace) -> int:
    if args.env_id not in crl_envs.env_ids():
        print(f"Unknown env id {args.env_id!r}. Choose one of: {', '.join(crl_envs.env_ids())}",
              file=sys.stderr)
        return 2
    check_range("--seed", args.seed, 0, 2**63 - 1)  # gymnasium takes seeds >= 0
    check_range("--episodes", args.episodes, 1, 10_000)
    if sys.stdin is None or sys.stdin.closed:
        raise UserFacingError("stdin is closed: crl play reads one action a line from the "
                              "terminal or a pipe (e.g. printf 'up\\n' | crl play ENV_ID).")
    play(args.env_id, seed=args.seed, episodes=args.episodes)
    return 0
