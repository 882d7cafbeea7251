"""``ALFWorldExpert``: plays an ALFWorld game from the game's own solution.

Each ``game.tw-pddl`` carries a ``walkthrough`` (the solution its generator verified). The expert
answers its commands in order while it alone has played the episode; if other moves were made
(it took over mid-episode) or a command is not admissible, it asks the engine's planner for a
plan from the current state. It gives upper bounds and tests that every game can be won.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

__all__ = ["ALFWorldExpert"]


class ALFWorldExpert:
    """Walkthrough agent for ``CRL/ALFWorld-v0`` (reads the solution from the env).

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/ALFWorld-v0", split="eval_out_of_distribution")
        >>> from crl_envs.oracles import play_episode
        >>> episode = play_episode(env, ALFWorldExpert(env), seed=0)
        >>> episode.won, episode.reward
        (True, 1.0)
        >>> env.close()
    """

    def __init__(self, env: gym.Env) -> None:
        self.env = env.unwrapped
        self._plan: list[str] = []
        self._played = 0

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        """Take the game's walkthrough as the plan."""
        self._plan = self.env.walkthrough
        self._played = 0

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """The next command of the plan (replanned when the episode left it)."""
        in_step = self.env.elapsed_steps == self._played
        if not (in_step and self._plan and self._plan[0] in info["admissible_actions"]):
            self._plan = self.env.replan()
            if not self._plan:
                raise RuntimeError(f"The planner found no plan for ALFWorld game {self.env.game.game_id}.")
        self._played = self.env.elapsed_steps + 1
        return self._plan.pop(0)
