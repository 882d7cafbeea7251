"""MiniHack (Room, Maze, KeyRoom, River) on the real NetHack engine, as CRL text envs.

- ``render``: the fog-of-war text view of a NetHack map (apart from any env);
- ``env``: ``MiniHackEnv`` (one class, the task and variant are kwargs) and ``make_raw_env``;
- ``oracle``: ``MiniHackOracle``, a planner that reads only the text observation.
"""

from crl_envs.minihack.env import TASKS, MiniHackEnv, make_raw_env

__all__ = ["TASKS", "MiniHackEnv", "make_raw_env"]
