"""A scripted MiniHack agent that reads only the text observation.

Holds:
- ``parse_observation``: the text map, hero position, message and inventory of an observation;
- ``MiniHackOracle``: a planner over the parsed map. It walks a cheapest path (Dijkstra, with
  unexplored cells assumed walkable) to the staircase down when it has seen it, else to a near
  unexplored cell that borders much unknown; it fights a monster next to it; KeyRoom: to the
  key, ``pickup``, next to the door, ``apply key``, through the door; River: branch and bound
  over chains of boulder pushes that fill a crossing (each boulder's pushes, in any of the 8
  directions, by A*), learning from refused pushes where boulders hide, and exploring the bank
  when the boulders in sight are too few.
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
                                 if cell != view.hero and view.cells.get(cell) in _FLOOR}
        if self._last is None:
            return
        cell, action = self._last
        if action in MOVES and view.hero == cell and _adjacent_monster(view) is None:
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
                elif view.cells.get(ahead) in _FLOOR:
                    self._unseen_boulders.add(ahead)

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

    def _explore(self, view: ParsedView, among: set[Cell] | None = None) -> str | None:
        """Head for the unexplored cell (of ``among`` when given) that is cheap to reach and
        borders the most unknown; ``None`` if ``among`` has none in reach."""
        reached = _paths(view, self._blocked)
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
        """Cross once a crossing is filled; else follow the boulder plan, replanning on surprises.

        When the boulders in sight cannot fill a crossing, the land's unseen cells (behind
        boulders) are explored first; only then does a plan fill as far across as it can.
        """
        water = view.find("}")
        if water:
            far_bank = min(cell[0] for cell in water) + _RIVER_WIDTH
            across = {cell for cell in _paths(view, self._blocked) if cell[0] >= far_bank}
            if across:
                self._plan = []
                return _cheapest_first_step(view, across, self._blocked)
        if "sinks" in view.message:  # the boulder did not fill: the plan's next steps assume it did
            self._plan = []
        if not (self._plan and self._plan[0][0] == view.hero):
            plan = _river_plan(self._river_view(view), frozenset(self._stuck))
            self._plan = plan.steps if plan else []
            if water and not (plan and plan.crosses):
                step = self._explore(view, _unseen_land(view, min(cell[0] for cell in water)))
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


def _unseen_land(view: ParsedView, near: int) -> set[Cell]:
    """Unexplored cells west of the river inside the box of the floor seen (boulders can hide
    floor and other boulders; the box leaves out the unseen stone around the level)."""
    floor = [cell for cell, char in view.cells.items() if char in (*_FLOOR, "`")]
    xs, ys = [c[0] for c in floor], [c[1] for c in floor]
    return {cell for cell, char in view.cells.items()
            if char == UNEXPLORED and min(xs) <= cell[0] < near and min(ys) <= cell[1] <= max(ys)}


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
        for (dx, dy), name in _NAMES.items():
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
class _RiverPlan:
    """The pushes chosen and how far across they fill: ``crosses`` when the hero can walk over."""

    steps: list[tuple[Cell, str]]
    crosses: bool


def _river_plan(view: ParsedView,
                stuck: frozenset[tuple[Cell, Cell]] = frozenset()) -> _RiverPlan | None:
    """The shortest chain of boulder pushes found that fills a crossing of the river, else the
    chain that fills furthest across with the boulders in sight (``crosses`` False).

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
        return None
    far_bank = min(cell[0] for cell in water) + _RIVER_WIDTH
    rows = range(min(cell[1] for cell in floor), max(cell[1] for cell in floor) + 1)
    near = far_bank - _RIVER_WIDTH
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
            key = (True, _RIVER_WIDTH, -len(steps))
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
    return _RiverPlan(list(best[0]), best[1][0]) if best[0] else None


def _distance(a: Cell, b: Cell) -> int:
    return max(abs(a[0] - b[0]), abs(a[1] - b[1]))


def _adjacent_monster(view: ParsedView) -> str | None:
    """The move that attacks an adjacent monster, if there is one."""
    hx, hy = view.hero
    for name, (dx, dy) in MOVES.items():
        if view.cells.get((hx + dx, hy + dy), "").isalpha() and _step_cost(view, view.hero, (hx + dx, hy + dy)):
            return name
    return None
