"""A scripted MiniHack agent that reads only the text observation.

Holds, from its modules:
- ``view``: ``MOVES``, ``ParsedView`` and ``parse_observation`` (the text map, hero position,
  message and inventory of an observation);
- ``paths``: cheapest paths over the parsed map (Dijkstra, with unexplored cells assumed
  walkable), ``shortest_walk`` and ``moves_along``;
- ``river``: MiniHack River's planner, branch and bound over chains of boulder pushes that fill
  a crossing (each boulder's pushes, in any of the 8 directions, by A*);
- ``agent``: ``MiniHackOracle``, what it does on each task (stairs, monsters, KeyRoom's key and
  door, River's pushes, exploring);
- ``lessons``: lessons that hold for every level of a Room retrieval key (``best_sweep`` from
  the start cell, broken off for the stairs once in view: ``room_lesson``) and the policy such a
  lesson states (``lesson_policy``), which ``crl_envs.transferable_lesson`` and
  ``crl_envs.lesson_policy`` find.
"""

from crl_envs.minihack.oracle.agent import MiniHackOracle
from crl_envs.minihack.oracle.paths import moves_along, shortest_walk
from crl_envs.minihack.oracle.view import MOVES, ParsedView, parse_observation

__all__ = ["MOVES", "ParsedView", "parse_observation", "shortest_walk", "moves_along",
           "MiniHackOracle"]
