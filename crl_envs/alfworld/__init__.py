"""ALFWorld as a text environment (``CRL/ALFWorld-v0``) on the real TextWorld/PDDL engine.

Holds ``data`` (splits and game listing from an index, archives extracted once into the cache),
``env`` (``ALFWorldEnv``) and ``oracle`` (``ALFWorldExpert``, which plays the game's own
walkthrough). Importing this package does not import the engine.
"""

from crl_envs.alfworld.data import SPLITS, TASK_TYPES, Game, list_games

__all__ = ["SPLITS", "TASK_TYPES", "Game", "list_games"]
