"""``SokobanOracle``: a scripted Sokoban player that sees only the text observation.

It parses the grid out of each observation (``Level.from_text``), solves it with the
move-optimal solver and answers the first move. Re-solving from the text at every step means it
never relies on hidden state, which is the point: if it wins every episode, the observation
carries all a model needs. A grid with no solution left (a box pushed where it cannot leave, by
a move the oracle did not choose) is lost: it plays on with one fixed move until the step limit.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from crl_envs.sokoban.env import ACTIONS
from crl_envs.sokoban.level import Level
from crl_envs.sokoban.solver import solve

__all__ = ["SokobanOracle"]


class SokobanOracle:
    """Optimal Sokoban play from the observation text alone.

    ``env`` is accepted for the oracle protocol (``crl_envs.oracles.make_oracle``) and not read.

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/Sokoban-v0")
        >>> obs, info = env.reset(seed=3)
        >>> oracle = SokobanOracle(env)
        >>> oracle.reset(obs, info)
        >>> terminated = truncated = False
        >>> while not (terminated or truncated):
        ...     obs, reward, terminated, truncated, info = env.step(oracle.act(obs, info))
        >>> info["won"], reward
        (True, 1.0)
    """

    def __init__(self, env: gym.Env | None = None) -> None:
        self.env = env

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        """Nothing to forget: every move is planned from the observation it answers."""

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """The first move of a shortest solution of the grid in ``observation``."""
        plan = solve(Level.from_text(observation))
        return plan[0] if plan else ACTIONS[0]  # no solution left: the level is lost
