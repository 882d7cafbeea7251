"""Scripted oracle agents, one per env, behind one small protocol.

Oracles give upper bounds and prove that the text an env emits carries what an agent needs.
The MiniHack and Sokoban oracles read only the text observation; the WebShop, ALFWorld and SWE
oracles use the episode's own solution (goal product, walkthrough, gold patch), which is why
``make_oracle`` receives the env.

Holds:
- ``Agent``: the step-at-a-time agent protocol (reset on the first observation, then act) that
  oracles, the harness's model and human agents all follow.
- ``ORACLES`` / ``make_oracle``: each env id's scripted oracle.
- ``Episode`` / ``play_episode``: one episode played to its end by any such agent (the loop that
  tests, benchmarks and ``crl eval`` share).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym

__all__ = ["Agent", "ORACLES", "make_oracle", "Episode", "play_episode"]


class Agent(Protocol):
    """Plays one episode at a time: ``reset`` on the first observation, then ``act`` each step."""

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        """Start a new episode from the reset observation."""

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """Return the next action for the current observation."""


# env id -> "module:Class"; the class is constructed with the (wrapped) env.
ORACLES: dict[str, str] = {
    "CRL/MiniHackRoom-v0": "crl_envs.minihack.oracle:MiniHackOracle",
    "CRL/MiniHackMaze-v0": "crl_envs.minihack.oracle:MiniHackOracle",
    "CRL/MiniHackKeyRoom-v0": "crl_envs.minihack.oracle:MiniHackOracle",
    "CRL/MiniHackRiver-v0": "crl_envs.minihack.oracle:MiniHackOracle",
    "CRL/Sokoban-v0": "crl_envs.sokoban.oracle:SokobanOracle",
    "CRL/WebShop-v0": "crl_envs.webshop.oracle:WebShopOracle",
    "CRL/ALFWorld-v0": "crl_envs.alfworld.oracle:ALFWorldExpert",
    "CRL/SWEBench-v0": "crl_envs.swebench.oracle:GoldPatchAgent",
    "CRL/SWEBenchToy-v0": "crl_envs.swebench.oracle:GoldPatchAgent",
}


def make_oracle(env_id: str, env: gym.Env) -> Agent:
    """Build the scripted oracle of ``env_id`` for ``env``."""
    if env_id not in ORACLES:
        raise KeyError(f"No scripted oracle for {env_id!r}; known: {', '.join(ORACLES)}.")
    module_name, class_name = ORACLES[env_id].split(":")
    return getattr(importlib.import_module(module_name), class_name)(env)


@dataclass
class Episode:
    """One episode played to its end: ``observations[0]`` and ``infos[0]`` are the reset's,
    ``observations[i + 1]``, ``rewards[i]`` and ``infos[i + 1]`` what ``actions[i]`` gave."""

    observations: list[str] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False

    @property
    def observation(self) -> str:
        """The last observation."""
        return self.observations[-1]

    @property
    def info(self) -> dict[str, Any]:
        """The last info."""
        return self.infos[-1]

    @property
    def reward(self) -> float:
        """The last step's reward (the outcome's, for the CRL envs)."""
        return self.rewards[-1] if self.rewards else 0.0

    @property
    def steps(self) -> int:
        """How many actions the agent took."""
        return len(self.actions)

    @property
    def won(self) -> bool:
        """The env's verdict at the end (``info["won"]``)."""
        return bool(self.info.get("won", False))


def play_episode(env: gym.Env, agent: Agent, seed: int | None = None,
                 options: dict[str, Any] | None = None,
                 after_step: Callable[[Episode], None] | None = None) -> Episode:
    """Reset ``env``, then step it with ``agent``'s actions until terminated or truncated.

    ``after_step`` sees the episode after each step (e.g. to read what the agent did there).

    Example:
        >>> import crl_envs
        >>> env = gym.make("CRL/Sokoban-v0")
        >>> episode = play_episode(env, make_oracle("CRL/Sokoban-v0", env), seed=0)
        >>> episode.won, episode.reward, episode.terminated, episode.steps == len(episode.actions)
        (True, 1.0, True, True)
    """
    observation, info = env.reset(seed=seed, options=options)
    episode = Episode(observations=[observation], infos=[info])
    agent.reset(observation, info)
    while not (episode.terminated or episode.truncated):
        action = agent.act(observation, info)
        observation, reward, terminated, truncated, info = env.step(action)
        episode.actions.append(action)
        episode.observations.append(observation)
        episode.rewards.append(float(reward))
        episode.infos.append(info)
        episode.terminated, episode.truncated = bool(terminated), bool(truncated)
        if after_step is not None:
            after_step(episode)
    return episode
