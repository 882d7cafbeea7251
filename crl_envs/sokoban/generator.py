"""Seeded generation of solvable Sokoban levels.

Holds ``generate_level(rng, ...)``, which, for one try:

1. carves the room with gym-sokoban's random walk (a walker that changes direction with
   probability 0.35 stamps one of five small floor masks at each of ``int(1.7 * (h + w))`` steps;
   the outer ring stays wall), so the floor is always connected;
2. places the targets on random floor cells;
3. searches backwards from every solved state (boxes on the targets, player on any free cell),
   the player walking and *pulling* boxes, breadth-first in moves. Because the search starts
   from all solved states at once, the depth at which it first meets a state is exactly that
   state's optimal solution length in forward moves;
4. takes the farthest state within ``[min_solution_length, max_solution_length]`` that has no box
   on a target (ties broken by the rng) as the start;
5. checks it with the independent forward solver (``solver.solve``), which must find a solution
   of exactly that length.

A try whose room admits no start within the bounds is retried with the next draws of the same
rng, so a seed always gives the same level. Bounds that no room satisfies raise ``ValueError``
after ``max_tries``.
"""

from __future__ import annotations

import numpy as np

from crl_envs.sokoban.level import Level, layout_neighbours
from crl_envs.sokoban.solver import solve

__all__ = ["generate_level", "DEFAULT_MIN_SOLUTION_LENGTH", "DEFAULT_MAX_SOLUTION_LENGTH"]

# Defaults leave room for mistakes within the 30-step limit of CRL/Sokoban-v0: a level needs at
# least a few moves, and at most 20, so an agent may waste 10 steps and still win.
DEFAULT_MIN_SOLUTION_LENGTH = 4
DEFAULT_MAX_SOLUTION_LENGTH = 20
P_CHANGE_DIRECTION = 0.35

# gym-sokoban's floor masks: the walker's cell (centre) plus a small neighbourhood, as
# (row offset, col offset) pairs.
_MASKS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, -1), (0, 0), (0, 1)),
    ((-1, 0), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, 0)),
    ((0, -1), (0, 0), (1, -1), (1, 0)),
    ((0, 0), (0, 1), (1, 0)),
)
_STEPS = ((1, 0), (0, 1), (-1, 0), (0, -1))


def generate_level(
    rng: np.random.Generator,
    *,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 2,
    min_solution_length: int = DEFAULT_MIN_SOLUTION_LENGTH,
    max_solution_length: int = DEFAULT_MAX_SOLUTION_LENGTH,
    max_tries: int = 1000,
) -> Level:
    """A solvable level whose optimal solution has ``min..max_solution_length`` moves.

    ``dim_room`` is the whole grid (height, width) including the outer wall. The result's
    ``solution_length`` is the optimal number of moves, checked by the forward solver.

    Example:
        >>> import numpy as np
        >>> level = generate_level(np.random.default_rng(0))
        >>> level == generate_level(np.random.default_rng(0))
        True
        >>> DEFAULT_MIN_SOLUTION_LENGTH <= level.solution_length <= DEFAULT_MAX_SOLUTION_LENGTH
        True
    """
    height, width = dim_room
    if height < 3 or width < 3:
        raise ValueError(f"dim_room={dim_room!r} leaves no floor inside the outer wall.")
    if num_boxes < 1 or num_boxes + 2 > (height - 2) * (width - 2):
        raise ValueError(
            f"num_boxes={num_boxes} does not fit a {height}x{width} room: use 1.."
            f"{(height - 2) * (width - 2) - 2}."
        )
    if not 1 <= min_solution_length <= max_solution_length:
        raise ValueError(
            f"Need 1 <= min_solution_length <= max_solution_length, got "
            f"{min_solution_length} and {max_solution_length}."
        )
    num_walk_steps = int(1.7 * (height + width))
    for _ in range(max_tries):
        floor = _carve_room(rng, height, width, num_walk_steps)
        cells = [cell for cell in range(height * width) if floor >> cell & 1]
        if len(cells) < num_boxes + 2:
            continue
        targets = 0
        for index in rng.choice(len(cells), size=num_boxes, replace=False):
            targets |= 1 << cells[int(index)]
        start = _farthest_start(width, height, floor, targets, cells, min_solution_length,
                                max_solution_length, rng)
        if start is None:
            continue
        player, boxes, length = start
        level = Level(width=width, height=height, floor=floor, targets=targets, boxes=boxes,
                      player=player, solution_length=length)
        solution = solve(level, max_moves=length)
        if solution is None or len(solution) != length:
            raise RuntimeError(
                f"Generator bug: reverse search gave length {length}, forward solver "
                f"{None if solution is None else len(solution)} for\n{level.to_text()}"
            )
        return level
    raise ValueError(
        f"No {height}x{width} level with {num_boxes} boxes and an optimal solution of "
        f"{min_solution_length}..{max_solution_length} moves was found in {max_tries} tries; "
        "widen the bounds."
    )


def _carve_room(rng: np.random.Generator, height: int, width: int, num_steps: int) -> int:
    """gym-sokoban's random-walk room topology, as a floor bitmask (outer ring is wall)."""
    change = rng.random(num_steps) < P_CHANGE_DIRECTION
    new_steps = rng.integers(0, len(_STEPS), size=num_steps + 1)
    masks = rng.integers(0, len(_MASKS), size=num_steps)
    row = int(rng.integers(1, height - 1))
    col = int(rng.integers(1, width - 1))
    d_row, d_col = _STEPS[int(new_steps[num_steps])]
    floor = 0
    for step in range(num_steps):
        if change[step]:
            d_row, d_col = _STEPS[int(new_steps[step])]
        row = min(max(row + d_row, 1), height - 2)
        col = min(max(col + d_col, 1), width - 2)
        for m_row, m_col in _MASKS[int(masks[step])]:
            r, c = row + m_row, col + m_col
            if 0 < r < height - 1 and 0 < c < width - 1:
                floor |= 1 << (r * width + c)
    return floor


def _farthest_start(
    width: int,
    height: int,
    floor: int,
    targets: int,
    cells: list[int],
    min_length: int,
    max_length: int,
    rng: np.random.Generator,
) -> tuple[int, int, int] | None:
    """(player, boxes, optimal length) of a farthest start within the bounds, or ``None``.

    Breadth-first reverse play from all solved states: the player steps to a free neighbour,
    optionally pulling the box on its other side along.
    """
    neighbours = layout_neighbours(width, height, floor)
    shift = (width * height).bit_length()
    player_mask = (1 << shift) - 1
    frontier = [targets << shift | cell for cell in cells if not targets >> cell & 1]
    seen = set(frontier)
    best: list[int] = []
    best_depth = 0
    for depth in range(1, max_length + 1):
        next_frontier = []
        for state in frontier:
            player = state & player_mask
            boxes = state >> shift
            for direction, step in enumerate(neighbours):
                to = step[player]
                if to < 0 or boxes >> to & 1:
                    continue
                new_state = boxes << shift | to
                if new_state not in seen:
                    seen.add(new_state)
                    next_frontier.append(new_state)
                behind = neighbours[direction ^ 1][player]  # up<->down, left<->right
                if behind >= 0 and boxes >> behind & 1:
                    new_state = (boxes ^ (1 << behind) ^ (1 << player)) << shift | to
                    if new_state not in seen:
                        seen.add(new_state)
                        next_frontier.append(new_state)
        if not next_frontier:
            break
        frontier = next_frontier
        if depth >= min_length:
            off_targets = [s for s in frontier if not (s >> shift) & targets]
            if off_targets:
                best, best_depth = off_targets, depth
    if not best:
        return None
    state = best[int(rng.integers(len(best)))] if len(best) > 1 else best[0]
    return state & player_mask, state >> shift, best_depth
