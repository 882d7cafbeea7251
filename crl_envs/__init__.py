"""Complementary RL Gym text environments.

Importing this package registers every CRL env id with gymnasium (Gymnasium 1.x has no plugin
auto-loading), so ``gym.make("CRL/MiniHackRoom-v0")`` and ``gym.make("crl_envs:CRL/...")`` work.
All ids are registered in ``register_envs`` below, one readable table.
"""

from __future__ import annotations

from gymnasium.envs.registration import WrapperSpec, register, registry

from crl_envs.base import TEXT_CHARSET, TextEnv, Transition

__all__ = ["TEXT_CHARSET", "TextEnv", "Transition", "ENV_IDS", "register_envs"]

# Hands gym.make's max_episode_steps to envs that act on their last step (applied after
# TimeLimit): ALFWorld's -1 budget, SWE-bench's forced submission.
_FOLLOW_TIME_LIMIT = WrapperSpec("StepBudgetFromTimeLimit",
                                 "crl_envs.base:StepBudgetFromTimeLimit", {})

# Step limits: the paper's released settings (30 turns for MiniHack, Sokoban and ALFWorld,
# 10 for WebShop, 50 for SWE).
_TABLE: list[dict] = [
    dict(id="CRL/MiniHackRoom-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=30, kwargs={"task": "room"}),
    dict(id="CRL/MiniHackMaze-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=30, kwargs={"task": "maze"}),
    dict(id="CRL/MiniHackKeyRoom-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=30, kwargs={"task": "keyroom"}),
    dict(id="CRL/MiniHackRiver-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=30, kwargs={"task": "river"}),
    dict(id="CRL/Sokoban-v0", entry_point="crl_envs.sokoban.env:SokobanEnv",
         max_episode_steps=30, kwargs={}),
    dict(id="CRL/WebShop-v0", entry_point="crl_envs.webshop.env:WebShopEnv",
         max_episode_steps=10, kwargs={}),
    dict(id="CRL/ALFWorld-v0", entry_point="crl_envs.alfworld.env:ALFWorldEnv",
         max_episode_steps=30, kwargs={},
         # hands gym.make's max_episode_steps to the env's -1 budget (applied after TimeLimit)
         additional_wrappers=(_FOLLOW_TIME_LIMIT,)),
    dict(id="CRL/SWEBench-v0", entry_point="crl_envs.swebench.env:SWEBenchEnv",
         max_episode_steps=50, kwargs={}, additional_wrappers=(_FOLLOW_TIME_LIMIT,)),
    dict(id="CRL/SWEBenchToy-v0", entry_point="crl_envs.swebench.env:SWEBenchEnv",
         max_episode_steps=50, kwargs={"dataset": "toy", "sandbox": "local"},
         additional_wrappers=(_FOLLOW_TIME_LIMIT,)),
]

ENV_IDS: list[str] = [row["id"] for row in _TABLE]


def register_envs() -> None:
    """Register every CRL id (idempotent)."""
    for row in _TABLE:
        if row["id"] not in registry:
            register(**row)


register_envs()
