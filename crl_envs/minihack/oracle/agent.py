"""The scripted MiniHack agent: what it does on each task, reading only the text observation.

Holds ``MiniHackOracle``: it walks a cheapest path (``paths``) to the staircase down when it has
seen it, else to a near unexplored cell that borders much unknown; it fights a monster next to
it; KeyRoom: to the key, ``pickup``, next to the door, ``apply key``, through the door; River: the
chain of boulder pushes that fills a crossing (``river``), learning from refused pushes where
boulders hide, and exploring the bank when the boulders in sight are too few.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

from crl_envs.minihack.oracle.paths import (
    adjacent_monster,
    cheapest_first_step,
    cheapest_paths,
    distance,
)
from crl_envs.minihack.oracle.river import RIVER_WIDTH, river_plan, unseen_land
from crl_envs.minihack.oracle.view import FLOOR, MOVES, Cell, ParsedView, parse_observation
from crl_envs.minihack.render import UNEXPLORED

__all__ = ["MiniHackOracle"]

_INFORMATION_WEIGHT = 6.0  # exploring: one more unknown neighbour is worth 6 steps of detour


class MiniHackOracle:
    """A planner for every CRL MiniHack task, reading only the text observation.

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> from crl_envs.oracles import play_episode
        >>> env = gym.make("CRL/MiniHackRoom-v0", variant="plain")
        >>> play_episode(env, MiniHackOracle(env), seed=1).won
        True
        >>> env.close()
    """

    def __init__(self, env: gym.Env) -> None:
        self.task = getattr(env.unwrapped, "task_name", "room")
        self._key_cell: Cell | None = None
        self._blocked: set[tuple[Cell, Cell]] = set()
        self._last: tuple[Cell, str] | None = None
        self._view: ParsedView | None = None
        self._plan: list[tuple[Cell, str]] = []  # River: (hero cell before, action) still to do
        self._stuck: set[tuple[Cell, Cell]] = set()  # River: refused pushes (boulder, cell ahead)
        self._sunk: set[Cell] = set()  # River: water cells with a boulder under them (no push in)
        self._unseen_boulders: set[Cell] = set()  # River: boulders shown as floor (out of sight)

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        """Forget the previous episode."""
        self._key_cell = None
        self._blocked = set()
        self._last = None
        self._plan = []
        self._stuck = set()
        self._sunk = set()
        self._unseen_boulders = set()
        self._view = parse_observation(observation)

    def act(self, observation: str, info: dict[str, Any]) -> str:
        """The next action for this observation."""
        view = parse_observation(observation) or self._view
        self._view = view
        self._learn_blocked_move(view)
        action = self._choose(view)
        self._last = (view.hero, action)
        return action

    # ----------------------------------------------------------------- planning
    def _learn_blocked_move(self, view: ParsedView) -> None:
        """A move that left the hero in place (a wall, a squeeze) is not tried again."""
        # A boulder inferred out of sight is forgotten once in sight or stood on.
        self._unseen_boulders = {cell for cell in self._unseen_boulders
                                 if cell != view.hero and view.cells.get(cell) in FLOOR}
        if self._last is None:
            return
        cell, action = self._last
        if action in MOVES and view.hero == cell and adjacent_monster(view) is None:
            dx, dy = MOVES[action]
            self._blocked.add((cell, (cell[0] + dx, cell[1] + dy)))
            if "in vain" in view.message:  # a boulder that did not move: not that way again
                ahead = (cell[0] + 2 * dx, cell[1] + 2 * dy)
                self._stuck.add(((cell[0] + dx, cell[1] + dy), ahead))
                # Only a boulder stops a push into water or onto floor: one unseen behind the
                # pushed one (boulders block sight), one from under it (two on a cell move one
                # at a time), or one left under the water by the level's generator.
                if view.cells.get(ahead) == "}":
                    self._sunk.add(ahead)
                elif view.cells.get(ahead) in FLOOR:
                    self._unseen_boulders.add(ahead)

    def _choose(self, view: ParsedView) -> str:
        stairs = set(view.find(">"))
        if any(distance(cell, view.hero) == 1 for cell in stairs):
            return cheapest_first_step(view, stairs, self._blocked) or self._explore(view)
        enemy = adjacent_monster(view)
        if enemy is not None:
            return enemy  # fleeing gives a monster free hits: fight it

        if self.task == "keyroom":
            action = self._keyroom(view, stairs)
            if action:
                return action
        if self.task == "river" and not (stairs and cheapest_first_step(view, stairs, self._blocked)):
            action = self._river(view)
            if action:
                return action
        if stairs:
            step = cheapest_first_step(view, stairs, self._blocked)
            if step:
                return step
        return self._explore(view)

    def _explore(self, view: ParsedView, among: set[Cell] | None = None) -> str | None:
        """Head for the unexplored cell (of ``among`` when given) that is cheap to reach and
        borders the most unknown; ``None`` if ``among`` has none in reach."""
        reached = cheapest_paths(view, self._blocked)
        best: tuple[float, str] | None = None
        for cell, (cost, first) in reached.items():
            if view.cells.get(cell) != UNEXPLORED or (among is not None and cell not in among):
                continue
            unknown = sum(
                view.cells.get((cell[0] + dx, cell[1] + dy), UNEXPLORED) == UNEXPLORED
                for dx, dy in MOVES.values()
            )
            score = cost - _INFORMATION_WEIGHT * unknown
            if best is None or score < best[0]:
                best = (score, first)
        if among is not None:
            return best[1] if best else None
        return best[1] if best else "north"

    def _keyroom(self, view: ParsedView, stairs: set[Cell]) -> str | None:
        if not re.search(r"\bkey\b", view.inventory):
            keys = view.find("(")
            if keys:
                self._key_cell = min(keys, key=lambda c: distance(c, view.hero))
            if self._key_cell == view.hero or "key" in view.message and "see here" in view.message:
                return "pickup"
            if self._key_cell is not None:
                return cheapest_first_step(view, {self._key_cell}, self._blocked)
            return None
        if stairs and cheapest_first_step(view, stairs, self._blocked):
            return None  # the door is open (or not in the way): go to the stairs
        for door in view.find("+"):
            for name in ("north", "south", "east", "west"):
                dx, dy = MOVES[name]
                if view.hero == (door[0] - dx, door[1] - dy):
                    return f"apply key {name}"
            beside = {
                (door[0] - dx, door[1] - dy)
                for dx, dy in (MOVES[n] for n in ("north", "south", "east", "west"))
                if view.cells.get((door[0] - dx, door[1] - dy)) in (".", "(", ">", "<")
            }
            step = cheapest_first_step(view, beside, self._blocked)
            if step:
                return step
        return None

    def _river(self, view: ParsedView) -> str | None:
        """Cross once a crossing is filled; else follow the boulder plan, replanning on surprises.

        When the boulders in sight cannot fill a crossing, the land's unseen cells (behind
        boulders) are explored first; only then does a plan fill as far across as it can.
        """
        water = view.find("}")
        if water:
            far_bank = min(cell[0] for cell in water) + RIVER_WIDTH
            across = {cell for cell in cheapest_paths(view, self._blocked) if cell[0] >= far_bank}
            if across:
                self._plan = []
                return cheapest_first_step(view, across, self._blocked)
        if "sinks" in view.message:  # the boulder did not fill: the plan's next steps assume it did
            self._plan = []
        if not (self._plan and self._plan[0][0] == view.hero):
            plan = river_plan(self._river_view(view), frozenset(self._stuck))
            self._plan = plan.steps if plan else []
            if water and not (plan and plan.crosses):
                step = self._explore(view, unseen_land(view, min(cell[0] for cell in water)))
                if step:
                    self._plan = []
                    return step
        if self._plan and self._plan[0][0] == view.hero:
            return self._plan.pop(0)[1]
        return None

    def _river_view(self, view: ParsedView) -> ParsedView:
        """The view with what failed pushes taught: boulders out of sight, water that cannot
        be filled (shown as stone)."""
        cells = dict(view.cells)
        cells.update({cell: "`" for cell in self._unseen_boulders})
        cells.update({cell: " " for cell in self._sunk if cells.get(cell) == "}"})
        return ParsedView(cells, view.hero, view.message, view.inventory)
