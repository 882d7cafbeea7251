"""A move-optimal forward Sokoban solver.

Holds:
- ``solve(level)``: the shortest list of moves that puts every box on a target, or ``None``.
- ``live_cells(...)``: the cells from which a lone box can still reach a target (the rest are
  dead squares: a box pushed there can never be solved, so the search never pushes one there).

The search is breadth-first over compact states ``(boxes bitmask << shift) | player cell``:
every move costs one step, so the first solved state found is a shortest solution in moves
(what the 30-step limit counts). A search over pushes with the player normalised to its
reachable region would visit fewer states but yield the fewest pushes, not the fewest moves; on
a 6x6 room with two boxes there are at most a few thousand move states, so the exact move count
costs well under a millisecond.
"""

from __future__ import annotations

from functools import lru_cache

from crl_envs.sokoban.level import DIRECTIONS, Level, layout_neighbours

__all__ = ["solve", "live_cells"]

ACTION_NAMES: tuple[str, ...] = tuple(name for name, _, _ in DIRECTIONS)


@lru_cache(maxsize=4096)
def live_cells(width: int, height: int, floor: int, targets: int) -> int:
    """Bitmask of cells from which a box alone on the board can be pushed onto some target.

    Computed backwards: a box at ``b`` can be pulled to ``b + d`` when the player has room at
    ``b + d`` and ``b + 2d``; every cell reached from a target that way is live.
    """
    neighbours = layout_neighbours(width, height, floor)
    live = targets
    stack = [cell for cell in range(width * height) if targets >> cell & 1]
    while stack:
        box = stack.pop()
        for step in neighbours:
            pulled_to = step[box]
            if pulled_to < 0 or step[pulled_to] < 0 or live >> pulled_to & 1:
                continue
            live |= 1 << pulled_to
            stack.append(pulled_to)
    return live


def solve(level: Level, max_moves: int | None = None) -> list[str] | None:
    """A shortest solution of ``level`` as action names, or ``None`` if none has ``<= max_moves``.

    Example:
        >>> from crl_envs.sokoban.level import Level
        >>> solve(Level.from_text("# # # # # #\\n# P X _ O #\\n# # # # # #"))
        ['right', 'right']
        >>> solve(Level.from_text("# # # # #\\n# X P O #\\n# # # # #")) is None
        True
    """
    if level.is_solved:
        return []
    neighbours = level.neighbours
    live = live_cells(level.width, level.height, level.floor, level.targets)
    if level.boxes & ~live:
        return None
    shift = (level.width * level.height).bit_length()
    player_mask = (1 << shift) - 1
    goal = level.targets
    start = level.boxes << shift | level.player
    parent: dict[int, tuple[int, int]] = {start: (-1, -1)}
    frontier = [start]
    depth = 0
    while frontier and (max_moves is None or depth < max_moves):
        depth += 1
        next_frontier = []
        for state in frontier:
            player = state & player_mask
            boxes = state >> shift
            for direction, step in enumerate(neighbours):
                to = step[player]
                if to < 0:
                    continue
                if boxes >> to & 1:
                    box_to = step[to]
                    if box_to < 0 or boxes >> box_to & 1 or not live >> box_to & 1:
                        continue
                    new_boxes = boxes ^ (1 << to) ^ (1 << box_to)
                    new_state = new_boxes << shift | to
                    if new_state in parent:
                        continue
                    parent[new_state] = (state, direction)
                    if new_boxes == goal:
                        return _path(parent, new_state)
                else:
                    new_state = boxes << shift | to
                    if new_state in parent:
                        continue
                    parent[new_state] = (state, direction)
                next_frontier.append(new_state)
        frontier = next_frontier
    return None


def _path(parent: dict[int, tuple[int, int]], state: int) -> list[str]:
    moves = []
    previous, direction = parent[state]
    while previous >= 0:
        moves.append(ACTION_NAMES[direction])
        state = previous
        previous, direction = parent[state]
    moves.reverse()
    return moves
