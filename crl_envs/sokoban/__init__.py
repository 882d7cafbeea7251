"""Sokoban as a text environment (``CRL/Sokoban-v0``): a 6x6 room, two boxes, two targets.

Holds ``level`` (the level state and its text symbols), ``generator`` (seeded random-walk rooms
plus reverse search, every level verified solvable), ``solver`` (move-optimal forward search),
``env`` (``SokobanEnv``) and ``oracle`` (``SokobanOracle``, which plays from the text alone).
"""

from crl_envs.sokoban.generator import generate_level
from crl_envs.sokoban.level import Level
from crl_envs.sokoban.solver import solve

__all__ = ["Level", "generate_level", "solve"]
