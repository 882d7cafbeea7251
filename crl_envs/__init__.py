"""Complementary RL Gym text environments.

Importing this package registers every CRL env id with gymnasium (Gymnasium 1.x has no plugin
auto-loading), so ``gym.make("CRL/MiniHackRoom-v0")`` and ``gym.make("crl_envs:CRL/...")`` work.
All ids are registered in ``register_envs`` below, one readable table.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from gymnasium.envs.registration import WrapperSpec, load_env_creator, register, registry

from crl_envs.base import TEXT_CHARSET, TextEnv, Transition

__all__ = ["TEXT_CHARSET", "TextEnv", "Transition", "ENV_IDS", "env_ids", "MAX_EPISODE_STEPS",
           "RIVER_STEPS", "register_envs", "env_keywords", "check_make_kwargs",
           "exact_retrieval_key", "winning_route", "transferable_lesson", "lesson_policy"]

# Hands gym.make's max_episode_steps to envs that act on their last step (applied after
# TimeLimit): ALFWorld's -1 budget, SWE-bench's forced submission.
_FOLLOW_TIME_LIMIT = WrapperSpec("StepBudgetFromTimeLimit",
                                 "crl_envs.base:StepBudgetFromTimeLimit", {})

# Step limits: the paper's released settings (30 turns for MiniHack, Sokoban and ALFWorld,
# 10 for WebShop, 50 for SWE), except River: crossing takes the scripted oracle 22-129 moves
# (median 60, seeds 0-299), so 30 made it unwinnable; within 100 it wins 93.7% (281/300; 293
# with no limit: a boulder sinks without filling 1 time in 10). Upstream's own horizon, 350,
# adds 4% and triples a losing model's turns.
RIVER_STEPS = 100
"""CRL/MiniHackRiver-v0's step limit: the scripted oracle wins >= 90% within it (upstream: 350)"""

_TABLE: list[dict] = [
    dict(id="CRL/MiniHackRoom-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=30, kwargs={"task": "room"}),
    dict(id="CRL/MiniHackMaze-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=30, kwargs={"task": "maze"}),
    dict(id="CRL/MiniHackKeyRoom-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=30, kwargs={"task": "keyroom"}),
    dict(id="CRL/MiniHackRiver-v0", entry_point="crl_envs.minihack.env:MiniHackEnv",
         max_episode_steps=RIVER_STEPS, kwargs={"task": "river"}),
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
"""the ids of the table above (the envs this package ships); ``env_ids()`` adds any registered since"""
MAX_EPISODE_STEPS = 100_000
"""bound on a ``max_episode_steps`` keyword (far above any benchmark's; a turn costs a reply)"""


def register_envs() -> None:
    """Register every CRL id (idempotent)."""
    for row in _TABLE:
        if row["id"] not in registry:
            register(**row)



def env_ids() -> list[str]:
    """Every id registered in gymnasium's ``CRL`` namespace: the table's, then any registered
    since (``gymnasium.register(id="CRL/Name-v0", ...)``), which is all a new env needs for the
    harness to list, configure, make and evaluate it.

    >>> env_ids()[:2]
    ['CRL/MiniHackRoom-v0', 'CRL/MiniHackMaze-v0']
    """
    return [env_id for env_id, spec in registry.items() if spec.namespace == "CRL"]


def env_keywords(env_id: str) -> set[str] | None:
    """The keyword arguments ``gym.make(env_id, ...)`` accepts: its env's constructor's and
    ``max_episode_steps``; None when the constructor takes ``**kwargs`` (anything goes)."""
    entry_point = registry[env_id].entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    parameters = inspect.signature(creator).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named | {"max_episode_steps"}


def exact_retrieval_key(env_id: str) -> bool:
    """Whether ``env_id``'s ``info["retrieval_query"]`` names the level exactly (its env class
    declares ``metadata["retrieval_key"] = "exact"``: MiniHack's start cell and view, Sokoban's
    layout), so that an entry without every word of the key is another level's.

    >>> exact_retrieval_key("CRL/Sokoban-v0"), exact_retrieval_key("CRL/WebShop-v0")
    (True, False)
    """
    entry_point = registry[env_id].entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    return getattr(creator, "metadata", {}).get("retrieval_key") == "exact"


# Envs whose won episode proves a route a lesson can state: the reader of the shortest one the
# episode's observations show (a lesson of the moves as played keeps the detours and bumps).
_ROUTE_READERS = {
    "CRL/MiniHackRoom-v0": "crl_envs.minihack.oracle.paths:walk_to_stairs",
    "CRL/MiniHackMaze-v0": "crl_envs.minihack.oracle.paths:walk_to_stairs",
}


def winning_route(env_id: str, observations: list[str]) -> list[str] | None:
    """The shortest route from the start to the goal that a won episode's ``observations`` (in
    order) show, for envs whose goal is a place (MiniHack Room and Maze); None elsewhere, or
    where the observations show none.

    >>> winning_route("CRL/Sokoban-v0", ["# # #"]) is None
    True
    """
    reader = _ROUTE_READERS.get(env_id)
    return load_env_creator(reader)(observations) if reader else None


# Envs whose levels of one retrieval key share a lesson that transfers (a dark Room's sweep from
# the start cell), and the readers of the policy such a lesson states.
_LESSON_WRITERS = {"CRL/MiniHackRoom-v0": "crl_envs.minihack.oracle.lessons:room_lesson"}
_LESSON_POLICIES = {"CRL/MiniHackRoom-v0": "crl_envs.minihack.oracle.lessons:lesson_policy"}


def transferable_lesson(env_id: str, key: str, max_episode_steps: int) -> tuple[str, str] | None:
    """The oracle's lesson, ``(title, content)``, that holds for every level of ``env_id`` with
    the retrieval ``key`` (``info["retrieval_query"]``) within ``max_episode_steps``: MiniHack
    Room's best sweep from the start cell, broken off for the stairs once they are in view (the
    stairs' route where the key shows them); None elsewhere, or for a key it cannot read.

    >>> transferable_lesson("CRL/Sokoban-v0", "any", 30) is None
    True
    """
    writer = _LESSON_WRITERS.get(env_id)
    return load_env_creator(writer)(key, max_episode_steps) if writer else None


def lesson_policy(env_id: str, text: str) -> Callable[[str], str | None] | None:
    """The policy that the first lesson in ``text`` states, in the form ``transferable_lesson``
    writes (route lessons too): observation in, the action it says (None once it says no
    more); None for envs without a reader, or where ``text`` holds no lesson of that form.

    >>> lesson_policy("CRL/MiniHackRoom-v0", "Avoid the walls.") is None
    True
    """
    reader = _LESSON_POLICIES.get(env_id)
    return load_env_creator(reader)(text) if reader else None


def check_make_kwargs(env_id: str, kwargs: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` (one line: what is wrong, what is allowed) unless
    ``gym.make(env_id, **kwargs)`` takes ``kwargs``: keys the env takes, a whole
    ``max_episode_steps`` in 1..MAX_EPISODE_STEPS (gym.make only asserts it), values the env's
    constructor accepts (it is built and closed).

    >>> check_make_kwargs("CRL/Sokoban-v0", {"max_episode_steps": 6})
    >>> check_make_kwargs("CRL/Sokoban-v0", {"max_episode_steps": True})
    Traceback (most recent call last):
    ...
    ValueError: max_episode_steps must be a whole number of steps in 1..100000, got True
    """
    import gymnasium as gym

    known = env_keywords(env_id)
    unknown = sorted(set(kwargs) - known) if known is not None else []
    if unknown:
        raise ValueError(f"{env_id} takes no argument {', '.join(map(repr, unknown))}; it "
                         f"takes: {', '.join(sorted(known or ()))}")
    steps = kwargs.get("max_episode_steps")
    # bool is an int to Python: true would make 1-step episodes
    if "max_episode_steps" in kwargs and (isinstance(steps, bool) or not isinstance(steps, int)
                                          or not 1 <= steps <= MAX_EPISODE_STEPS):
        raise ValueError(f"max_episode_steps must be a whole number of steps in "
                         f"1..{MAX_EPISODE_STEPS}, got {steps!r}")
    try:
        gym.make(env_id, **kwargs).close()
    except (TypeError, ValueError, AssertionError) as err:
        raise ValueError(f"the arguments do not fit {env_id}: {err}") from err


register_envs()
