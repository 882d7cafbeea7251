"""Fog-of-war text rendering of a NetHack map, apart from any env.

Holds:
- ``UNEXPLORED``, ``ROCK``, ``OPEN_DOOR``: the characters this view adds to NetHack's own symbols;
- ``LEGEND``: what every character of the view means (the env puts it in its instructions);
- ``level_key``: the retrieval key of a level, from its first observation (start cell and what is
  in view, by offset);
- ``FogOfWarView``: remembers which cells the hero has ever seen and renders the explored part
  of the map as a framed, coordinate-labelled text grid plus a list of what is in view.

NetHack's glyph memory already keeps every cell the hero has seen (a remembered wall stays on the
map after the hero walks away). What it cannot tell apart is "solid rock the hero looked at" and
"never seen": both are the blank stone glyph. The view therefore tracks a ``seen`` mask: a cell
is seen once it showed a non-stone glyph or was next to the hero (the hero always perceives the
eight cells around it, even in the dark). Seen stone is drawn as ``ROCK``, unseen cells as
``UNEXPLORED``.
"""

from __future__ import annotations

import functools
import re

import numpy as np
from nle import nethack

__all__ = ["UNEXPLORED", "ROCK", "OPEN_DOOR", "LEGEND", "FogOfWarView", "describe_offset",
           "level_key"]

UNEXPLORED = "?"
ROCK = "#"
OPEN_DOOR = "/"

_CMAP = nethack.GLYPH_CMAP_OFF
_STONE_GLYPH = _CMAP + 0
# NetHack draws open doors with the wall characters '-' and '|'; a distinct character keeps a
# reader (model or oracle) from taking an open door for a wall.
_OPEN_DOOR_GLYPHS = (_CMAP + 13, _CMAP + 14)
_CLOSED_DOOR_GLYPHS = (_CMAP + 15, _CMAP + 16)
_STAIRS_DOWN_GLYPH = _CMAP + 24

# Per-glyph lookup tables: one fancy-index per step instead of per-cell Python calls.
_ALL_GLYPHS = np.arange(nethack.MAX_GLYPH)
_IS_NOTABLE = (
    nethack.glyph_is_monster(_ALL_GLYPHS)
    | nethack.glyph_is_object(_ALL_GLYPHS)
    | nethack.glyph_is_trap(_ALL_GLYPHS)
    | np.isin(_ALL_GLYPHS, (*_OPEN_DOOR_GLYPHS, *_CLOSED_DOOR_GLYPHS, _STAIRS_DOWN_GLYPH))
)
_IS_OPEN_DOOR = np.isin(_ALL_GLYPHS, _OPEN_DOOR_GLYPHS)

LEGEND: dict[str, str] = {
    "@": "you",
    ".": "floor (lit or remembered dark floor, or a doorway without a door)",
    ROCK: "solid rock you have looked at (impassable)",
    "|": "wall",
    "-": "wall",
    "+": "closed door (may be locked)",
    OPEN_DOOR: "open door (enter and leave it straight, never diagonally)",
    ">": "staircase down: the goal",
    "<": "staircase up",
    "(": "tool, e.g. the key",
    "`": "boulder (walk into it to push it)",
    "}": "water (deep: do not walk in; a boulder pushed into it fills it)",
    "^": "trap (avoid it)",
    "a-z, A-Z": "a monster (walk into it to attack it)",
    UNEXPLORED: "unexplored (never seen)",
}

def describe_offset(dx: int, dy: int) -> str:
    """Words for a map offset from the hero, north/south first.

    >>> describe_offset(2, -1)
    '1 north, 2 east'
    >>> describe_offset(0, 0)
    'here'
    """
    parts = [
        f"{abs(d)} {word}"
        for word, d in (("north", -dy if dy < 0 else 0), ("south", dy if dy > 0 else 0),
                        ("east", dx if dx > 0 else 0), ("west", -dx if dx < 0 else 0))
        if d
    ]
    return ", ".join(parts) if parts else "here"


_HERO_LINE = re.compile(r"^You \(@\) are at (x=\d+, y=\d+)\.", re.MULTILINE)
_IN_VIEW_LINE = re.compile(r"^In view: (.*)\.$", re.MULTILINE)
_ABSOLUTE = re.compile(r" at x=\d+, y=\d+ \(([^)]*)\)")


def level_key(observation: str) -> str | None:
    """The key of a level in a first observation of ``FogOfWarView.render``: the start cell and
    what is in view, each thing by its offset only (absolute cells would repeat the start's
    ``x=``/``y=`` words and pull retrieval toward other levels that start in the same row or
    column). ``None`` when the observation shows no hero.

    >>> level_key("You (@) are at x=38, y=10. HP 12/12.\\n"
    ...           "In view: staircase down (>) at x=38, y=11 (1 south).")
    'x=38, y=10; in view: staircase down (>) 1 south'
    """
    hero = _HERO_LINE.search(observation)
    if hero is None:
        return None
    in_view = _IN_VIEW_LINE.search(observation)
    seen = _ABSOLUTE.sub(r" \1", in_view.group(1)) if in_view else "nothing notable"
    return f"{hero.group(1)}; in view: {seen}"


@functools.lru_cache(maxsize=4096)
def _feature_name(glyph: int, char: str) -> str:
    """What a notable cell holds, in words (stairs, doors, items, monsters, traps)."""
    if nethack.glyph_is_monster(glyph):
        return f"monster {nethack.permonst(nethack.glyph_to_mon(glyph)).mname} ({char})"
    if nethack.glyph_is_trap(glyph):
        return f"trap: {nethack.symdef.from_idx(nethack.glyph_to_cmap(glyph)).explanation} (^)"
    if nethack.glyph_is_object(glyph):
        name = "boulder" if char == "`" else "item"
        if char == "(":
            name = "key or other tool"
        return f"{name} ({char})"
    if glyph == _STAIRS_DOWN_GLYPH:
        return "staircase down (>)"
    if glyph in _CLOSED_DOOR_GLYPHS:
        return "closed door (+)"
    return f"open door ({OPEN_DOOR})"


class FogOfWarView:
    """The hero's view of one NetHack level: remembered cells kept, unexplored cells marked.

    ``update(glyphs, chars, hero_x, hero_y)`` after every game step; ``render()`` returns the
    explored part of the map (its bounding box plus a one-cell margin of ``UNEXPLORED``), framed
    with x coordinates above and y coordinates on the left, followed by the hero's position and
    the notable things in view with their offsets from the hero.

    Example:
        >>> import numpy as np
        >>> from nle import nethack
        >>> glyphs = np.full((21, 79), nethack.GLYPH_CMAP_OFF, dtype=np.int16)  # all stone
        >>> chars = np.full((21, 79), ord(" "), dtype=np.uint8)
        >>> glyphs[5, 10:13] = nethack.GLYPH_CMAP_OFF + 19                     # lit floor
        >>> chars[5, 10:13] = ord(".")
        >>> chars[5, 11] = ord("@")
        >>> view = FogOfWarView()
        >>> view.update(glyphs, chars, hero_x=11, hero_y=5)
        >>> print(view.render_map())
        Map (top-left cell is x=9, y=3; x grows east, y grows south):
             01111
             90123
           3 ?????
           4 ?###?
           5 ?.@.?
           6 ?###?
           7 ?????
    """

    def __init__(self) -> None:
        self.seen = np.zeros((nethack.DUNGEON_SHAPE[0], nethack.DUNGEON_SHAPE[1]), dtype=bool)
        self.hero = (0, 0)
        self._origin = (0, 0)
        self._glyphs = np.zeros((0, 0), dtype=np.int16)
        self._chars = np.zeros((0, 0), dtype=np.uint8)
        self._seen = np.zeros((0, 0), dtype=bool)

    def reset(self) -> None:
        """Forget everything (a new level)."""
        self.seen[:] = False

    def update(self, glyphs: np.ndarray, chars: np.ndarray, hero_x: int, hero_y: int) -> None:
        """Take in the current NetHack glyph memory and the hero's position."""
        seen = self.seen
        seen |= glyphs != _STONE_GLYPH
        seen[max(hero_y - 1, 0) : hero_y + 2, max(hero_x - 1, 0) : hero_x + 2] = True
        rows = seen.any(axis=1).nonzero()[0]
        cols = seen.any(axis=0).nonzero()[0]
        y0, y1 = max(rows[0] - 1, 0), min(rows[-1] + 2, seen.shape[0])
        x0, x1 = max(cols[0] - 1, 0), min(cols[-1] + 2, seen.shape[1])
        # Copies of the explored crop: NLE reuses its buffers and blanks them when the game
        # ends, and the last picture must survive that.
        self._glyphs = glyphs[y0:y1, x0:x1].copy()
        self._chars = chars[y0:y1, x0:x1].copy()
        self._seen = seen[y0:y1, x0:x1].copy()
        self._origin = (int(x0), int(y0))
        self.hero = (int(hero_x), int(hero_y))

    def render_map(self) -> str:
        """The explored part of the map as a framed text grid."""
        x0, y0 = self._origin
        seen, glyphs = self._seen, self._glyphs
        grid = self._chars.copy()
        grid[seen & (glyphs == _STONE_GLYPH)] = ord(ROCK)
        grid[_IS_OPEN_DOOR[glyphs]] = ord(OPEN_DOOR)
        grid[~seen] = ord(UNEXPLORED)
        xs = [f"{x:02d}" for x in range(x0, x0 + grid.shape[1])]
        lines = [
            f"Map (top-left cell is x={x0}, y={y0}; x grows east, y grows south):",
            "     " + "".join(x[0] for x in xs),
            "     " + "".join(x[1] for x in xs),
        ]
        lines += [f"{y0 + i:>4} {row.tobytes().decode('latin-1')}" for i, row in enumerate(grid)]
        return "\n".join(lines)

    def features(self) -> list[str]:
        """Notable seen cells (stairs, doors, items, boulders, monsters, traps), nearest first."""
        x0, y0 = self._origin
        hx, hy = self.hero
        glyphs = self._glyphs
        notable = self._seen & _IS_NOTABLE[glyphs]
        notable[hy - y0, hx - x0] = False
        found = []
        for y, x in zip(*notable.nonzero(), strict=True):
            x, y = int(x) + x0, int(y) + y0
            name = _feature_name(int(glyphs[y - y0, x - x0]), chr(self._chars[y - y0, x - x0]))
            distance = max(abs(x - hx), abs(y - hy))
            found.append((distance, f"{name} at x={x}, y={y} ({describe_offset(x - hx, y - hy)})"))
        return [text for _, text in sorted(found, key=lambda item: item[0])]

    def render(self, status: str = "") -> str:
        """Map, the hero's position (and ``status``) and the notable things in view."""
        hx, hy = self.hero
        lines = [self.render_map(), f"You (@) are at x={hx}, y={hy}.{' ' + status if status else ''}"]
        features = self.features()
        lines.append("In view: " + ("; ".join(features) if features else "nothing notable") + ".")
        return "\n".join(lines)
