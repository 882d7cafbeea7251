"""Scripted oracle agents, one per env, behind one small protocol.

Oracles give upper bounds and prove that the text an env emits carries what an agent needs.
The MiniHack and Sokoban oracles read only the text observation; the WebShop, ALFWorld and SWE
oracles use the episode's own solution (goal product, walkthrough, gold patch), which is why
``make_oracle`` receives the env.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

import gymnasium as gym

__all__ = ["ScriptedAgent", "ORACLES", "make_oracle"]


class ScriptedAgent(Protocol):
    """An agent that plays one episode at a time from observations."""

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


def make_oracle(env_id: str, env: gym.Env) -> ScriptedAgent:
    """Build the scripted oracle of ``env_id`` for ``env``."""
    if env_id not in ORACLES:
        raise KeyError(f"No scripted oracle for {env_id!r}; known: {', '.join(ORACLES)}.")
    module_name, class_name = ORACLES[env_id].split(":")
    return getattr(importlib.import_module(module_name), class_name)(env)
