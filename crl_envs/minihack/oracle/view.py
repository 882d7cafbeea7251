"""What the MiniHack oracle reads from a text observation, and the moves it can make.

Holds:
- ``Cell`` (x, y), ``MOVES`` (action -> offset), ``MOVE_NAMES`` (offset -> action) and ``FLOOR``
  (the characters of plain floor);
- ``ParsedView`` and ``parse_observation``: the text map, hero position, message and inventory
  of an observation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Cell", "MOVES", "MOVE_NAMES", "FLOOR", "ParsedView", "parse_observation"]

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
MOVE_NAMES: dict[Cell, str] = {offset: name for name, offset in MOVES.items()}
FLOOR = (".", "<", ">")
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
