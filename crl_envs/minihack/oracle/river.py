"""The MiniHack oracle's River planner: chains of boulder pushes that fill a crossing.

Holds:
- ``RIVER_WIDTH``: MiniHack River's three columns of water (the oracle sees only the first);
- ``river_plan`` and ``RiverPlan``: branch and bound over which boulder fills which river cell,
  each boulder's pushes (in any of the 8 directions) planned by A*;
- ``unseen_land``: the unexplored cells on the near bank where boulders may hide.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from crl_envs.minihack.oracle.view import FLOOR, MOVE_NAMES, MOVES, Cell, ParsedView
from crl_envs.minihack.render import UNEXPLORED

__all__ = ["RIVER_WIDTH", "RiverPlan", "river_plan", "unseen_land"]

RIVER_WIDTH = 3  # MiniHack-River-v0: three columns of water
_RIVER_MAX_PLAN = 80  # River: longer push plans are not searched


def unseen_land(view: ParsedView, near: int) -> set[Cell]:
    """Unexplored cells west of the river inside the box of the floor seen (boulders can hide
    floor and other boulders; the box leaves out the unseen stone around the level)."""
    floor = [cell for cell, char in view.cells.items() if char in (*FLOOR, "`")]
    xs, ys = [c[0] for c in floor], [c[1] for c in floor]
    return {cell for cell, char in view.cells.items()
            if char == UNEXPLORED and min(xs) <= cell[0] < near and min(ys) <= cell[1] <= max(ys)}


@dataclass
class _PushPlan:
    """Moves (hero cell before each, action) that push one boulder into one water cell."""

    steps: list[tuple[Cell, str]]
    hero: Cell  # where the hero ends


def _pushes_to(floor: set[Cell], water: Cell) -> dict[Cell, int]:
    """For each cell, the fewest pushes that roll a boulder from it into ``water`` over
    ``floor`` (the hero standing behind each push), other boulders ignored: a lower bound."""
    pushes = {water: 0}
    frontier = [water]
    while frontier:
        nxt_frontier = []
        for cell in frontier:
            for dx, dy in MOVES.values():
                before, behind = (cell[0] - dx, cell[1] - dy), (cell[0] - 2 * dx, cell[1] - 2 * dy)
                if before not in pushes and before in floor and behind in floor:
                    pushes[before] = pushes[cell] + 1
                    nxt_frontier.append(before)
        frontier = nxt_frontier
    return pushes


def _push(floor: set[Cell], boulders: set[Cell], hero: Cell, boulder: Cell, water: Cell,
          stuck: frozenset[tuple[Cell, Cell]] = frozenset(), limit: int = 10**6,
          pushes: dict[Cell, int] | None = None) -> _PushPlan | None:
    """The fewest moves (walks and pushes, in any of the 8 directions) that push ``boulder``
    into ``water``, if fewer than ``limit``; ``stuck`` holds the pushes (boulder cell, cell
    ahead) that the game refused. A* over (boulder, hero), estimating the pushes still needed
    (``pushes``: ``_pushes_to(floor, water)``) plus the walk to the boulder."""
    others = boulders - {boulder}
    open_floor = floor - others
    pushes = _pushes_to(floor, water) if pushes is None else pushes
    if boulder not in pushes:
        return None

    def estimate(at: Cell, here: Cell) -> int:
        return pushes.get(at, limit) + max(abs(here[0] - at[0]), abs(here[1] - at[1])) - 1

    start = (boulder, hero)
    queue: list[tuple[int, int, Cell, Cell]] = [(estimate(boulder, hero), 0, boulder, hero)]  # deepest first on ties
    previous: dict[tuple[Cell, Cell], tuple[tuple[Cell, Cell], str] | None] = {start: None}
    cost = {start: 0}
    while queue:
        _, negative, at, here = heapq.heappop(queue)
        spent = -negative
        if spent > cost[(at, here)]:
            continue
        if at == water:
            steps: list[tuple[Cell, str]] = []
            state = (at, here)
            while previous[state] is not None:
                state, action = previous[state]
                steps.append((state[1], action))
            return _PushPlan(steps[::-1], here)
        for (dx, dy), name in MOVE_NAMES.items():
            nxt = (here[0] + dx, here[1] + dy)
            if nxt == at:  # a push: the boulder rolls on, the hero takes its cell
                ahead = (at[0] + dx, at[1] + dy)
                if not (ahead == water or ahead in open_floor) or (at, ahead) in stuck:
                    continue
                state = (ahead, at)
            elif nxt in open_floor:
                state = (at, nxt)
            else:
                continue
            if spent + 1 + estimate(*state) >= limit or cost.get(state, limit) <= spent + 1:
                continue
            cost[state] = spent + 1
            previous[state] = ((at, here), name)
            heapq.heappush(queue, (spent + 1 + estimate(*state), -(spent + 1), *state))
    return None


@dataclass
class RiverPlan:
    """The pushes chosen and how far across they fill: ``crosses`` when the hero can walk over."""

    steps: list[tuple[Cell, str]]
    crosses: bool


def river_plan(view: ParsedView,
               stuck: frozenset[tuple[Cell, Cell]] = frozenset()) -> RiverPlan | None:
    """The shortest chain of boulder pushes found that fills a crossing of the river, else the
    chain that fills furthest across with the boulders in sight (``crosses`` False).

    Water blocks sight, so the oracle sees only the near column of the river; it assumes MiniHack
    River's width (``RIVER_WIDTH`` columns, hidden ones unexplored) and replans whenever the game
    differs from the plan (a boulder sinks without filling, a push fails). Each fill must touch
    the previous one (8-way), so the hero can walk across; branch and bound over which boulder
    fills which cell, pushes planned by ``_push``.
    """
    boulders = frozenset(view.find("`"))
    floor = {cell for cell, char in view.cells.items() if char in FLOOR} | boulders
    water = view.find("}")
    if not water:
        return None
    far_bank = min(cell[0] for cell in water) + RIVER_WIDTH
    rows = range(min(cell[1] for cell in floor), max(cell[1] for cell in floor) + 1)
    near = far_bank - RIVER_WIDTH
    filled = {cell for cell in floor if near <= cell[0] < far_bank}  # earlier fills (or boulders)
    # Hidden river cells count where they continue an earlier fill: water blocks sight.
    river = water + [(x, y) for x in range(near + 1, far_bank) for y in rows
                     if view.cells.get((x, y), UNEXPLORED) == UNEXPLORED
                     and any((x - 1, y + dy) in filled for dy in (-1, 0, 1))]
    # The best plan so far: (crosses, columns filled across, -steps) is maximised; a crossing
    # bounds the search by its length, a partial chain only by _RIVER_MAX_PLAN, and it must
    # fill further across than the fills already walkable from the bank.
    reach = {cell for cell in filled
             if cell[0] == near and any((near - 1, cell[1] + dy) in floor for dy in (-1, 0, 1))}
    frontier = list(reach)
    while frontier:
        cell = frontier.pop()
        for dx, dy in MOVES.values():
            nxt = (cell[0] + dx, cell[1] + dy)
            if nxt in filled and nxt not in reach:
                reach.add(nxt)
                frontier.append(nxt)
    across_now = max((cell[0] + 1 - near for cell in reach), default=0)
    best: list = [None, (False, across_now, -_RIVER_MAX_PLAN)]

    def bound() -> int:
        return -best[1][2] if best[1][0] else _RIVER_MAX_PLAN

    def extend(hero: Cell, boulders: frozenset, floor: set, last: Cell | None, steps: list) -> None:
        column = (last[0] + 1) if last else None
        if column == far_bank:
            key = (True, RIVER_WIDTH, -len(steps))
            if key > best[1]:
                best[:] = [steps, key]
            return
        if last is None:  # a river cell beside floor (the bank or an earlier fill)
            targets = [cell for cell in river if any((cell[0] - 1, cell[1] + dy) in floor for dy in (-1, 0, 1))]
        else:
            targets = [
                (column, last[1] + dy) for dy in (-1, 0, 1)
                if last[1] + dy in rows  # not the hidden wall above or below the river
                and view.cells.get((column, last[1] + dy), UNEXPLORED) in ("}", UNEXPLORED)
            ]
        options = []
        for target in targets:
            pushes = _pushes_to(floor, target)
            for boulder in boulders:
                if pushes.get(boulder, bound()) + len(steps) >= bound():
                    continue  # no way in, or not in fewer moves than the best plan
                plan = _push(floor, boulders, hero, boulder, target, stuck, bound() - len(steps),
                             pushes)
                if plan is not None:
                    options.append((len(plan.steps), target, boulder, plan))
        if not options and last is not None:  # a chain as far as the boulders in sight go
            key = (False, last[0] + 1 - near, -len(steps))
            if key > best[1]:
                best[:] = [steps, key]
        for _, target, boulder, plan in sorted(options, key=lambda option: option[0]):
            if len(steps) + len(plan.steps) < bound():
                extend(plan.hero, boulders - {boulder}, floor | {target}, target, steps + plan.steps)

    extend(view.hero, boulders, floor, None, [])
    return RiverPlan(list(best[0]), best[1][0]) if best[0] else None
