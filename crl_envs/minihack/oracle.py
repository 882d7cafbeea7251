"""A scripted MiniHack agent that reads only the text observation.

Holds:
- ``parse_observation``: the text map, hero position, message and inventory of an observation;
- ``MiniHackOracle``: a planner over the parsed map. It walks a cheapest path (Dijkstra, with
  unexplored cells assumed walkable) to the staircase down when it has seen it, else to a near
  unexplored cell that borders much unknown; it fights a monster next to it; KeyRoom: to the
  key, ``pickup``, next to the door, ``apply key``, through the door; River: branch and bound
  over chains of boulder pushes that fill a crossing.
"""

from __future__ import annotations

import heapq
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from crl_envs.minihack.render import OPEN_DOOR, UNEXPLORED

__all__ = ["MOVES", "ParsedView", "parse_observation", "shortest_walk", "moves_along",
           "MiniHackOracle"]

Cell = tuple[int, int]

MOVES: dict[str, Cell] = {  # action -> (dx, dy); y grows south
    "north": (0, -1),
    "south": (0, 1),
    "east": (1, 0),
    "west": (-1, 0),
    "northeast": (1, -1),
    "northwest": (-1, -1),
    "southeast": (1, 1),
    "southwest": (-1, 1),
}
_DOORS = ("+", OPEN_DOOR)
_WALKABLE = {".": 1.0, ">": 1.0, "<": 1.0, "(": 1.0, OPEN_DOOR: 1.0, UNEXPLORED: 1.5, "^": 25.0}
_INFORMATION_WEIGHT = 6.0  # exploring: one more unknown neighbour is worth 6 steps of detour
_MONSTER_COST = 6.0  # walking into a monster attacks it: fine when going around is longer
_RIVER_WIDTH = 3  # MiniHack-River-v0: three columns of water
_RIVER_MAX_PLAN = 80  # River: longer push plans are not searched
_MAP_HEADER = re.compile(r"Map \(top-left cell is x=(\d+), y=(\d+);")
_HERO = re.compile(r"You \(@\) are at x=(\d+), y=(\d+)\.")


@dataclass
class ParsedView:
    """What an observation says: the map cells, the hero, the message and the inventory."""

    cells: dict[Cell, str] = field(default_factory=dict)
    hero: Cell = (0, 0)
    message: str = ""
    inventory: str = ""  # the keys carried

    def find(self, char: str) -> list[Cell]:
        return [cell for cell, c in self.cells.items() if c == char]


def parse_observation(observation: str) -> ParsedView | None:
    """Read the map block of a MiniHack observation; ``None`` if it has none (invalid action)."""
    lines = observation.splitlines()
    header = next((i for i, line in enumerate(lines) if _MAP_HEADER.match(line)), None)
    if header is None:
        return None
    x0, y0 = (int(v) for v in _MAP_HEADER.match(lines[header]).groups())
    view = ParsedView()
    for line in lines[header + 3 :]:
        hero = _HERO.match(line)
        if hero:
            view.hero = (int(hero.group(1)), int(hero.group(2)))
            break
        row = line[5:]
        y = int(line[:4])
        for i, char in enumerate(row):
            view.cells[(x0 + i, y)] = char
    for line in lines:
        if line.startswith("Message: "):
            view.message = line.removeprefix("Message: ")
        elif line.startswith("Key: "):
            view.inventory = line.removeprefix("Key: ")
    view.cells[view.hero] = "."
    return view


def _step_cost(view: ParsedView, src: Cell, dst: Cell, monsters_ok: bool = True) -> float | None:
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


def _paths(view: ParsedView, blocked: set[tuple[Cell, Cell]]) -> dict[Cell, tuple[float, str]]:
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
            step = _step_cost(view, cell, nxt)
            if step is not None:
                heapq.heappush(queue, (cost + step, nxt, first or name))
    return reached


def _cheapest_first_step(view: ParsedView, goals: set[Cell], blocked: set[tuple[Cell, Cell]]) -> str | None:
    """The first move of a cheapest path from the hero to any goal cell."""
    reached = _paths(view, blocked)
    costs = [(reached[goal][0], goal) for goal in goals if goal in reached and goal != view.hero]
    return reached[min(costs)[1]][1] if costs else None


class MiniHackOracle:
    """A planner for every CRL MiniHack task, reading only the text observation.

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/MiniHackRoom-v0", variant="plain")
        >>> oracle = MiniHackOracle(env)
        >>> obs, info = env.reset(seed=1)
        >>> oracle.reset(obs, info)
        >>> for _ in range(30):
        ...     obs, reward, terminated, truncated, info = env.step(oracle.act(obs, info))
        ...     if terminated or truncated:
        ...         break
        >>> info["won"]
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

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        """Forget the previous episode."""
        self._key_cell = None
        self._blocked = set()
        self._last = None
        self._plan = []
        self._stuck = set()
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
        if self._last is None:
            return
        cell, action = self._last
        if action in MOVES and view.hero == cell and _adjacent_monster(view) is None:
            dx, dy = MOVES[action]
            self._blocked.add((cell, (cell[0] + dx, cell[1] + dy)))
            if "in vain" in view.message:  # a boulder that did not move: not that way again
                self._stuck.add(((cell[0] + dx, cell[1] + dy), (cell[0] + 2 * dx, cell[1] + 2 * dy)))

    def _choose(self, view: ParsedView) -> str:
        stairs = set(view.find(">"))
        if any(_distance(cell, view.hero) == 1 for cell in stairs):
            return _cheapest_first_step(view, stairs, self._blocked) or self._explore(view)
        enemy = _adjacent_monster(view)
        if enemy is not None:
            return enemy  # fleeing gives a monster free hits: fight it

        if self.task == "keyroom":
            action = self._keyroom(view, stairs)
            if action:
                return action
        if self.task == "river" and not (stairs and _cheapest_first_step(view, stairs, self._blocked)):
            action = self._river(view)
            if action:
                return action
        if stairs:
            step = _cheapest_first_step(view, stairs, self._blocked)
            if step:
                return step
        return self._explore(view)

    def _explore(self, view: ParsedView) -> str:
        """Head for the unexplored cell that is cheap to reach and borders the most unknown."""
        reached = _paths(view, self._blocked)
        best: tuple[float, str] | None = None
        for cell, (cost, first) in reached.items():
            if view.cells.get(cell) != UNEXPLORED:
                continue
            unknown = sum(
                view.cells.get((cell[0] + dx, cell[1] + dy), UNEXPLORED) == UNEXPLORED
                for dx, dy in MOVES.values()
            )
            score = cost - _INFORMATION_WEIGHT * unknown
            if best is None or score < best[0]:
                best = (score, first)
        return best[1] if best else "north"

    def _keyroom(self, view: ParsedView, stairs: set[Cell]) -> str | None:
        if not re.search(r"\bkey\b", view.inventory):
            keys = view.find("(")
            if keys:
                self._key_cell = min(keys, key=lambda c: _distance(c, view.hero))
            if self._key_cell == view.hero or "key" in view.message and "see here" in view.message:
                return "pickup"
            if self._key_cell is not None:
                return _cheapest_first_step(view, {self._key_cell}, self._blocked)
            return None
        if stairs and _cheapest_first_step(view, stairs, self._blocked):
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
            step = _cheapest_first_step(view, beside, self._blocked)
            if step:
                return step
        return None

    def _river(self, view: ParsedView) -> str | None:
        """Cross once a crossing is filled; else follow the boulder plan, replanning on surprises."""
        water = view.find("}")
        if water:
            far_bank = min(cell[0] for cell in water) + _RIVER_WIDTH
            across = {cell for cell in _paths(view, self._blocked) if cell[0] >= far_bank}
            if across:
                self._plan = []
                return _cheapest_first_step(view, across, self._blocked)
        if not (self._plan and self._plan[0][0] == view.hero):
            self._plan = _river_plan(view, frozenset(self._stuck))
        if self._plan and self._plan[0][0] == view.hero:
            return self._plan.pop(0)[1]
        return None


_NAMES = {offset: name for name, offset in MOVES.items()}
_FLOOR = (".", "<", ">")


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
    return [_NAMES[(b[0] - a[0], b[1] - a[1])] for a, b in itertools.pairwise(cells)]


@dataclass
class _PushPlan:
    """Moves (hero cell before each, action) that push one boulder into one water cell."""

    steps: list[tuple[Cell, str]]
    hero: Cell  # where the hero ends


def _push(floor: set[Cell], boulders: set[Cell], hero: Cell, boulder: Cell, water: Cell,
          stuck: frozenset[tuple[Cell, Cell]] = frozenset()) -> _PushPlan | None:
    """Push ``boulder`` east (straight and diagonal pushes) until it drops into ``water``;
    ``stuck`` holds the pushes (boulder cell, cell ahead) that the game refused."""
    dx, dy = water[0] - boulder[0], water[1] - boulder[1]
    if dx <= 0 or dx < abs(dy):
        return None
    diagonal = (1, (dy > 0) - (dy < 0))
    orders = (
        [diagonal] * abs(dy) + [(1, 0)] * (dx - abs(dy)),
        [(1, 0)] * (dx - abs(dy)) + [diagonal] * abs(dy),
    )
    best = None
    for order in orders:
        others, here, at, steps = boulders - {boulder}, hero, boulder, []
        for i, (ox, oy) in enumerate(order):
            behind, ahead = (at[0] - ox, at[1] - oy), (at[0] + ox, at[1] + oy)
            if here != behind:
                path = shortest_walk(floor, others | {at}, here, behind)
                if path is None:
                    break
                for cell in path:
                    steps.append((here, _NAMES[(cell[0] - here[0], cell[1] - here[1])]))
                    here = cell
            last = i == len(order) - 1
            if (ahead != water) if last else (ahead not in floor or ahead in others):
                break
            if (at, ahead) in stuck:
                break
            steps.append((here, _NAMES[(ox, oy)]))
            here, at = at, ahead
        else:
            if best is None or len(steps) < len(best.steps):
                best = _PushPlan(steps, here)
    return best


def _river_plan(view: ParsedView,
                stuck: frozenset[tuple[Cell, Cell]] = frozenset()) -> list[tuple[Cell, str]]:
    """The shortest chain of boulder pushes found that fills a crossing of the river.

    Water blocks sight, so the oracle sees only the near column of the river; it assumes MiniHack
    River's width (``_RIVER_WIDTH`` columns, hidden ones unexplored) and replans whenever the game
    differs from the plan (a boulder sinks without filling, a push fails). Each fill must touch
    the previous one (8-way), so the hero can walk across; branch and bound over which boulder
    fills which cell, pushes planned by ``_push``.
    """
    boulders = frozenset(view.find("`"))
    floor = {cell for cell, char in view.cells.items() if char in _FLOOR} | boulders
    water = view.find("}")
    if not water:
        return []
    far_bank = min(cell[0] for cell in water) + _RIVER_WIDTH
    rows = range(min(cell[1] for cell in floor), max(cell[1] for cell in floor) + 1)
    near = far_bank - _RIVER_WIDTH
    filled = {cell for cell in floor if near <= cell[0] < far_bank}  # earlier fills (or boulders)
    # Hidden river cells count where they continue an earlier fill: water blocks sight.
    river = water + [(x, y) for x in range(near + 1, far_bank) for y in rows
                     if view.cells.get((x, y), UNEXPLORED) == UNEXPLORED
                     and any((x - 1, y + dy) in filled for dy in (-1, 0, 1))]
    best: list = [None, _RIVER_MAX_PLAN]  # steps, cost

    def extend(hero: Cell, boulders: frozenset, floor: set, last: Cell | None, steps: list) -> None:
        column = (last[0] + 1) if last else None
        if column == far_bank or (last and not boulders):
            if len(steps) < best[1]:
                best[:] = [steps, len(steps)]
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
            for boulder in boulders:
                if target[0] - boulder[0] + len(steps) >= best[1]:
                    continue  # every push moves the boulder one column at most
                plan = _push(floor, boulders, hero, boulder, target, stuck)
                if plan is not None:
                    options.append((len(plan.steps), target, boulder, plan))
        for _, target, boulder, plan in sorted(options, key=lambda option: option[0]):
            if len(steps) + len(plan.steps) < best[1]:
                extend(plan.hero, boulders - {boulder}, floor | {target}, target, steps + plan.steps)

    extend(view.hero, boulders, floor, None, [])
    return list(best[0]) if best[0] else []


def _distance(a: Cell, b: Cell) -> int:
    return max(abs(a[0] - b[0]), abs(a[1] - b[1]))


def _adjacent_monster(view: ParsedView) -> str | None:
    """The move that attacks an adjacent monster, if there is one."""
    hx, hy = view.hero
    for name, (dx, dy) in MOVES.items():
        if view.cells.get((hx + dx, hy + dy), "").isalpha() and _step_cost(view, view.hero, (hx + dx, hy + dy)):
            return name
    return None
