"""A Sokoban level and its text form.

Holds:
- ``SYMBOLS`` / ``LEGEND``: the one symbol table of the text form (the paper family's symbols).
- ``DIRECTIONS``: the four moves, in the order the solver and generator index them.
- ``Level``: an immutable level state (layout, targets, boxes, player) with ``to_text`` and
  ``Level.from_text``, so a level round-trips through exactly the text a model sees.

Cells are ints ``row * width + col``; sets of cells (floor, boxes) are int bitmasks, which keeps
states hashable and cheap for the solver and the generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

__all__ = ["SYMBOLS", "LEGEND", "DIRECTIONS", "Level", "LevelFormatError"]

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"
SYMBOLS: dict[str, str] = {
    WALL: "wall",
    FLOOR: "empty floor",
    TARGET: "empty target",
    BOX: "box (not on a target)",
    BOX_ON_TARGET: "box on a target",
    PLAYER: "you (the player)",
    PLAYER_ON_TARGET: "you, standing on a target",
}
LEGEND: str = "\n".join(f"{symbol}  {meaning}" for symbol, meaning in SYMBOLS.items())

# (name, row step, col step); the order is the direction index used everywhere.
DIRECTIONS: tuple[tuple[str, int, int], ...] = (
    ("up", -1, 0),
    ("down", 1, 0),
    ("left", 0, -1),
    ("right", 0, 1),
)


class LevelFormatError(ValueError):
    """A level text does not describe a playable Sokoban level; the message says what is wrong."""


@dataclass(frozen=True)
class Level:
    """One Sokoban state: fixed layout (floor, targets) plus movable parts (boxes, player).

    ``floor``, ``targets`` and ``boxes`` are bitmasks over cells ``row * width + col``; every cell
    that is not floor is wall. ``solution_length`` is the optimal number of moves when known
    (the generator sets it), else ``None``.

    Example:
        >>> level = Level.from_text("# # # # #\\n# P X O #\\n# # # # #")
        >>> level.num_boxes, level.boxes_on_targets, level.is_solved
        (1, 0, False)
        >>> print(level.to_text())
        # # # # #
        # P X O #
        # # # # #
    """

    width: int
    height: int
    floor: int
    targets: int
    boxes: int
    player: int
    solution_length: int | None = None

    @property
    def num_boxes(self) -> int:
        return self.boxes.bit_count()

    @property
    def boxes_on_targets(self) -> int:
        return (self.boxes & self.targets).bit_count()

    @property
    def is_solved(self) -> bool:
        return self.boxes == self.targets

    @property
    def neighbours(self) -> tuple[tuple[int, ...], ...]:
        """``neighbours[d][cell]``: the floor cell one step in direction ``d``, or -1."""
        return layout_neighbours(self.width, self.height, self.floor)

    def to_text(self) -> str:
        """The grid as rows of space-separated symbols (see ``LEGEND``)."""
        rows = []
        for row in range(self.height):
            symbols = []
            for col in range(self.width):
                cell = row * self.width + col
                bit = 1 << cell
                on_target = bool(self.targets & bit)
                if not self.floor & bit:
                    symbols.append(WALL)
                elif cell == self.player:
                    symbols.append(PLAYER_ON_TARGET if on_target else PLAYER)
                elif self.boxes & bit:
                    symbols.append(BOX_ON_TARGET if on_target else BOX)
                else:
                    symbols.append(TARGET if on_target else FLOOR)
            rows.append(" ".join(symbols))
        return "\n".join(rows)

    @classmethod
    def from_text(cls, text: str) -> Level:
        """Parse the grid rows of ``to_text`` (cells may also be written without spaces).

        Lines that contain a character outside ``SYMBOLS`` (e.g. a status line) are ignored,
        so an observation can be parsed as it is.
        """
        grid = []
        for line in text.splitlines():
            cells = line.replace(" ", "")
            if cells and all(ch in SYMBOLS for ch in cells):
                grid.append(cells)
        if not grid:
            raise LevelFormatError("No grid rows found: expected rows of " + " ".join(SYMBOLS) + ".")
        width, height = len(grid[0]), len(grid)
        if any(len(line) != width for line in grid):
            raise LevelFormatError(f"Grid rows differ in length: {[len(line) for line in grid]}.")
        floor = targets = boxes = 0
        players = []
        for row, line in enumerate(grid):
            for col, symbol in enumerate(line):
                cell = row * width + col
                bit = 1 << cell
                if symbol != WALL:
                    floor |= bit
                if symbol in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets |= bit
                if symbol in (BOX, BOX_ON_TARGET):
                    boxes |= bit
                if symbol in (PLAYER, PLAYER_ON_TARGET):
                    players.append(cell)
        if len(players) != 1:
            raise LevelFormatError(f"Expected exactly one player (P or S), found {len(players)}.")
        if boxes.bit_count() != targets.bit_count() or not boxes:
            raise LevelFormatError(
                f"Expected as many boxes as targets (at least one), found {boxes.bit_count()} "
                f"boxes and {targets.bit_count()} targets."
            )
        return cls(width=width, height=height, floor=floor, targets=targets, boxes=boxes,
                   player=players[0])


@lru_cache(maxsize=4096)  # per-layout table, shared by the generator's retries and the solver
def layout_neighbours(width: int, height: int, floor: int) -> tuple[tuple[int, ...], ...]:
    """For each direction, a table cell -> the adjacent floor cell in that direction, or -1."""
    tables = []
    for _, d_row, d_col in DIRECTIONS:
        table = []
        for cell in range(width * height):
            row, col = divmod(cell, width)
            row, col = row + d_row, col + d_col
            inside = 0 <= row < height and 0 <= col < width
            target = row * width + col
            table.append(target if inside and floor >> target & 1 else -1)
        tables.append(tuple(table))
    return tuple(tables)
