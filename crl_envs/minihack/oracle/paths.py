"""Walking on a parsed MiniHack map: what a move costs and the cheapest ways to a goal.

Holds:
- ``step_cost``: the cost of one move (a monster in the way costs a fight; ``None`` where
  NetHack refuses it, such as diagonally through a door);
- ``cheapest_paths``: Dijkstra from the hero (unexplored cells assumed walkable as
  destinations), and ``cheapest_first_step`` to any of several goals;
- ``shortest_walk`` and ``moves_along``: a shortest 8-way walk over known floor, as move names;
- ``distance`` (the king-move distance) and ``adjacent_monster`` (the move that attacks one).
"""

from __future__ import annotations

import heapq
import itertools

from crl_envs.minihack.oracle.view import MOVE_NAMES, MOVES, Cell, ParsedView, parse_observation
from crl_envs.minihack.render import OPEN_DOOR, UNEXPLORED

__all__ = ["step_cost", "cheapest_paths", "cheapest_first_step", "shortest_walk", "moves_along",
           "distance", "adjacent_monster"]

_DOORS = ("+", OPEN_DOOR)
_WALKABLE = {".": 1.0, ">": 1.0, "<": 1.0, "(": 1.0, OPEN_DOOR: 1.0, UNEXPLORED: 1.5, "^": 25.0}
_MONSTER_COST = 6.0  # walking into a monster attacks it: fine when going around is longer


def step_cost(view: ParsedView, src: Cell, dst: Cell, monsters_ok: bool = True) -> float | None:
    """The cost of one move, or ``None`` if NetHack would not allow it."""
    char = view.cells.get(dst)
    if char is None:
        return None
    if char.isalpha():
        cost = _MONSTER_COST if monsters_ok else None
    else:
        cost = _WALKABLE.get(char)
    if cost is None:
        return None
    diagonal = src[0] != dst[0] and src[1] != dst[1]
    if diagonal and (view.cells.get(src) in _DOORS or char in _DOORS):
        return None
    return cost


def cheapest_paths(view: ParsedView,
                   blocked: set[tuple[Cell, Cell]]) -> dict[Cell, tuple[float, str]]:
    """Dijkstra from the hero: every reachable cell with its cost and the first move there.

    Unexplored cells are assumed walkable as destinations, never as waypoints.
    """
    start = view.hero
    queue: list[tuple[float, Cell, str]] = [(0.0, start, "")]
    reached: dict[Cell, tuple[float, str]] = {}
    while queue:
        cost, cell, first = heapq.heappop(queue)
        if cell in reached:
            continue
        reached[cell] = (cost, first)
        if view.cells.get(cell) == UNEXPLORED and cell != start:
            continue
        for name, (dx, dy) in MOVES.items():
            nxt = (cell[0] + dx, cell[1] + dy)
            if nxt in reached or (cell, nxt) in blocked:
                continue
            step = step_cost(view, cell, nxt)
            if step is not None:
                heapq.heappush(queue, (cost + step, nxt, first or name))
    return reached


def cheapest_first_step(view: ParsedView, goals: set[Cell],
                        blocked: set[tuple[Cell, Cell]]) -> str | None:
    """The first move of a cheapest path from the hero to any goal cell."""
    reached = cheapest_paths(view, blocked)
    costs = [(reached[goal][0], goal) for goal in goals if goal in reached and goal != view.hero]
    return reached[min(costs)[1]][1] if costs else None


def shortest_walk(floor: set[Cell], obstacles: set[Cell], start: Cell, goal: Cell) -> list[Cell] | None:
    """A shortest 8-way walk (the cells after ``start``) over known floor, avoiding obstacles."""
    previous: dict[Cell, Cell] = {start: start}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for cell in frontier:
            if cell == goal:
                path = []
                while cell != start:
                    path.append(cell)
                    cell = previous[cell]
                return path[::-1]
            for dx, dy in MOVES.values():
                nxt = (cell[0] + dx, cell[1] + dy)
                if nxt in floor and nxt not in obstacles and nxt not in previous:
                    previous[nxt] = cell
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return None


def moves_along(start: Cell, path: list[Cell]) -> list[str]:
    """The move names that walk ``path`` (the cells after ``start``, each next to the last)."""
    cells = [start, *path]
    return [MOVE_NAMES[(b[0] - a[0], b[1] - a[1])] for a, b in itertools.pairwise(cells)]


def distance(a: Cell, b: Cell) -> int:
    """The number of king moves from ``a`` to ``b``."""
    return max(abs(a[0] - b[0]), abs(a[1] - b[1]))


def adjacent_monster(view: ParsedView) -> str | None:
    """The move that attacks an adjacent monster, if there is one."""
    hx, hy = view.hero
    for name, (dx, dy) in MOVES.items():
        if view.cells.get((hx + dx, hy + dy), "").isalpha() and step_cost(view, view.hero, (hx + dx, hy + dy)):
            return name
    return None


def walk_to_stairs(observations: list[str]) -> list[str] | None:
    """The shortest walk from the first observation's hero cell to the stairs down over the floor
    cells the observations show (an episode's, in order): the route a won episode of a stairs
    task (Room, Maze) proves, without its detours and wall bumps; None where no observation
    shows the stairs or no walk over the seen floor reaches them.

    >>> walk_to_stairs(["You cannot move that way."]) is None
    True
    """
    views = [parse_observation(o) for o in observations]
    views = [v for v in views if v is not None]
    if not views:
        return None
    cells: dict[Cell, str] = {}
    for view in views:
        cells.update(view.cells)
    stairs = [cell for cell, char in cells.items() if char == ">"]
    floor = {cell for cell, char in cells.items() if char in (".", "<", ">")}
    start = views[0].hero
    walk = shortest_walk(floor, set(), start, stairs[0]) if stairs else None
    return moves_along(start, walk) if walk else None
