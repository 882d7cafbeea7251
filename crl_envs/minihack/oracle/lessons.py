"""Lessons that hold for every level of a retrieval key (MiniHack Room), and the policy a
lesson's text states.

A route ("from the start, play south, east.") is one level's: another level with the same start
cell hides its stairs elsewhere. In a dark 5x5 Room the hero sees only the eight cells around it
and the stairs lie anywhere in the room, so what holds for every level of a start cell is a
sweep: a fixed walk from that cell that brings as many of the stairs' possible places into view
as the step budget allows, broken off for the stairs once they are in view.

Holds:
- ``ROOM_CELLS``: the floor of MiniHack's 5x5 Room (every variant draws it at the same place);
- ``Sweep`` and ``best_sweep``: the best sweep from a start cell, by exhaustive search over its
  move sequences against every place of the stairs (the levels of that start cell);
- ``room_lesson``: the lesson for a Room retrieval key, as ``(title, content)`` in the route
  lessons' form (``crl_harness.warmstart``'s ``route_advice``), with the break-off sentence;
- ``LessonPolicy`` and ``lesson_policy``: the policy a lesson of that form states, which plays
  it without a model (its moves; the stairs once in view, where it says so).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from crl_envs.minihack.oracle.paths import moves_along, shortest_walk
from crl_envs.minihack.oracle.view import FLOOR, MOVES, Cell, parse_observation

__all__ = ["ROOM_CELLS", "MAX_SWEEP_MOVES", "MAX_LESSON_MOVES", "LESSON_TITLE", "LESSON_MOVES",
           "BREAK_OFF", "Sweep", "best_sweep", "room_lesson", "LessonPolicy", "lesson_policy"]

ROOM_CELLS: frozenset[Cell] = frozenset((x, y) for x in range(36, 41) for y in range(9, 14))
"""The floor of MiniHack's Room-5x5 (x 36-40, y 9-13): the hero starts and the stairs lie here"""
MAX_SWEEP_MOVES = 7
"""the longest sweep searched: 7 moves bring every cell of the room into view from any start"""
MAX_LESSON_MOVES = 64
"""a lesson naming more moves is no lesson of this form (a model's runaway answer)"""

# The route lessons' form (what the warm start teaches the extractor to write and the actor to
# follow), so that a sweep is retrieved by its key and played as routes are.
LESSON_TITLE = "Winning moves from "
LESSON_MOVES = "from the start, play "
BREAK_OFF = "Once the staircase down (>) is in view, stop and walk to it."
"""the sentence that makes a route a sweep: the walk is cut short for the stairs"""

_KEY = re.compile(r"^x=(\d+), y=(\d+); in view: (.*)$")
_STAIRS = re.compile(r"^staircase down \(>\) (.+)$")
_OFFSET_WORDS = {"north": (0, -1), "south": (0, 1), "east": (1, 0), "west": (-1, 0)}
_NOTHING = "nothing notable"

_INDEX = {cell: i for i, cell in enumerate(sorted(ROOM_CELLS))}
_FULL = (1 << len(_INDEX)) - 1


def _in_view(cell: Cell) -> int:
    """The room cells the hero sees from ``cell`` in the dark (it and its eight neighbours)."""
    return sum(1 << _INDEX[(cell[0] + dx, cell[1] + dy)] for dx in (-1, 0, 1) for dy in (-1, 0, 1)
               if (cell[0] + dx, cell[1] + dy) in _INDEX)


# The search's tables, computed once: each cell's view, and the moves that stay in the room.
_VIEW = {cell: _in_view(cell) for cell in ROOM_CELLS}
_STEPS = {cell: [(name, (cell[0] + dx, cell[1] + dy)) for name, (dx, dy) in MOVES.items()
                 if (cell[0] + dx, cell[1] + dy) in ROOM_CELLS] for cell in ROOM_CELLS}


@dataclass(frozen=True)
class Sweep:
    """A fixed walk from ``start``: its ``moves``, and of the ``levels`` places the stairs can
    take (every room cell but the start), the ``wins``: those in view by the end of the walk,
    which the hero then reaches in one move. ``rate`` is the share of the start cell's levels it
    wins; ``rate_unseen`` the share of those whose first view shows no stairs (the key "in view:
    nothing notable", where the sweep is the lesson).

    >>> sweep = best_sweep((36, 9), 5)
    >>> sweep.moves, sweep.wins, sweep.levels
    (('southeast', 'south', 'southeast', 'northeast', 'north'), 22, 24)
    """

    start: Cell
    moves: tuple[str, ...]
    wins: int
    levels: int
    seen_at_start: int

    @property
    def rate(self) -> float:
        return self.wins / self.levels

    @property
    def rate_unseen(self) -> float:
        return (self.wins - self.seen_at_start) / (self.levels - self.seen_at_start)


@functools.lru_cache(maxsize=len(ROOM_CELLS) * (MAX_SWEEP_MOVES + 1))
def best_sweep(start: Cell, moves: int) -> Sweep:
    """The sweep of at most ``moves`` moves (0..``MAX_SWEEP_MOVES``) from ``start`` (a room cell)
    that wins the most of the start cell's levels; of those, the one that reaches the stairs in
    the fewest moves summed over the levels, then the shortest. Exhaustive (branch and bound:
    a move brings at most 5 new cells into view); moves into a wall are never worth one."""
    if start not in ROOM_CELLS:
        raise ValueError(f"{start} is no cell of the 5x5 room (x 36-40, y 9-13)")
    if not 0 <= moves <= MAX_SWEEP_MOVES:
        raise ValueError(f"a sweep has 0..{MAX_SWEEP_MOVES} moves, got {moves}")
    best: list = [(-1, 0, 0), ()]  # (wins, -moves to the stairs summed, -length), moves

    def search(cell: Cell, seen: int, t: int, cost: int, path: list[str]) -> None:
        wins = seen.bit_count() - 1  # the start is no place of the stairs
        score = (wins, -cost, -len(path))
        if score > best[0]:
            best[0], best[1] = score, tuple(path)
        if t == moves or seen == _FULL or wins + 5 * (moves - t) < best[0][0]:
            return
        for name, nxt in _STEPS[cell]:
            new = _VIEW[nxt] & ~seen
            path.append(name)
            # stairs first seen after move t + 1 are reached with move t + 2
            search(nxt, seen | new, t + 1, cost + (t + 2) * new.bit_count(), path)
            path.pop()

    first = _VIEW[start]
    search(start, first, 0, first.bit_count() - 1, [])
    return Sweep(start, best[1], best[0][0], len(ROOM_CELLS) - 1, first.bit_count() - 1)


def room_lesson(key: str, max_episode_steps: int) -> tuple[str, str] | None:
    """The lesson that holds for every level of the Room retrieval ``key`` (``level_key``: the
    start cell and what is in view there) within ``max_episode_steps``, as ``(title, content)``:
    with the stairs in view, the shortest walk to them (the route a won episode's lesson
    states); with nothing in view, the ``best_sweep`` of ``max_episode_steps - 1`` moves (at most
    ``MAX_SWEEP_MOVES``) and ``BREAK_OFF``. None for a key it cannot read, a start off the 5x5
    room, or anything else in view (a monster, a trap: no sweep accounts for them).

    >>> room_lesson("x=36, y=9; in view: nothing notable", 6)[1]
    'from the start, play southeast, south, southeast, northeast, north. Once the staircase down (>) is in view, stop and walk to it.'
    >>> room_lesson("x=38, y=10; in view: staircase down (>) 1 south, 1 east", 6)
    ('Winning moves from x=38, y=10; in view: staircase down (>) 1 south, 1 east', 'from the start, play southeast.')
    """
    if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) \
            or max_episode_steps < 1:
        raise ValueError(f"max_episode_steps must be a whole number >= 1, got {max_episode_steps!r}")
    found = _KEY.match(key[:200])  # a key is one line of a few dozen characters
    if found is None:
        return None
    start = (int(found.group(1)), int(found.group(2)))
    if start not in ROOM_CELLS:
        return None
    title = f"{LESSON_TITLE}{key}"
    seen = found.group(3)
    if seen == _NOTHING:
        sweep = best_sweep(start, min(max_episode_steps - 1, MAX_SWEEP_MOVES))
        if not sweep.moves:
            return None
        return title, f"{LESSON_MOVES}{', '.join(sweep.moves)}. {BREAK_OFF}"
    stairs = _STAIRS.match(seen)
    offset = _offset(stairs.group(1)) if stairs else None
    if offset is None:
        return None
    goal = (start[0] + offset[0], start[1] + offset[1])
    walk = shortest_walk(set(ROOM_CELLS), set(), start, goal)
    if not walk or len(walk) > max_episode_steps:
        return None
    return title, f"{LESSON_MOVES}{', '.join(moves_along(start, walk))}."


def _offset(words: str) -> Cell | None:
    """The offset ``describe_offset`` wrote ("1 south, 2 east"); None for other text."""
    dx = dy = 0
    for part in words.split(", "):
        count, _, word = part.partition(" ")
        if not count.isdigit() or word not in _OFFSET_WORDS:
            return None
        dx += int(count) * _OFFSET_WORDS[word][0]
        dy += int(count) * _OFFSET_WORDS[word][1]
    return dx, dy


class LessonPolicy:
    """What a lesson of ``room_lesson``'s form tells the hero to do, as a policy over text
    observations: its moves in order, and with ``break_off`` (the lesson says ``BREAK_OFF``)
    the walk to the stairs as soon as they are in view. ``None`` once the moves are spent.
    ``to_goal`` says whether its last action was that walk (the lesson broken off, what a warm
    start's episode says it does) rather than the lesson's ``played``-th move.

    >>> policy = LessonPolicy(["east"], break_off=True)
    >>> policy("You (@) are at x=37, y=11."), policy.to_goal, policy.played  # no map: its move
    ('east', False, 1)
    >>> policy("You (@) are at x=38, y=11.") is None
    True
    """

    def __init__(self, moves: list[str], break_off: bool) -> None:
        self.moves = list(moves)
        self.break_off = break_off
        self.played = 0
        self.to_goal = False

    def __call__(self, observation: str) -> str | None:
        view = parse_observation(observation) if self.break_off else None
        stairs = view.find(">") if view is not None else []
        if stairs:
            floor = {cell for cell, char in view.cells.items() if char in FLOOR}
            walk = shortest_walk(floor, set(), view.hero, stairs[0])
            if walk:
                self.to_goal = True
                return moves_along(view.hero, walk)[0]
        self.to_goal = False
        if self.played >= len(self.moves):
            return None
        self.played += 1
        return self.moves[self.played - 1]


def lesson_policy(text: str) -> LessonPolicy | None:
    """The policy of the first lesson of ``room_lesson``'s form in ``text`` (an entry's content,
    or "title: content"): its moves, broken off for the stairs where the lesson says
    ``BREAK_OFF``; None where ``text`` holds no such lesson, names a move that is none, or more
    than ``MAX_LESSON_MOVES`` moves.

    >>> lesson_policy("x: from the start, play south, east. " + BREAK_OFF).moves
    ['south', 'east']
    >>> lesson_policy("from the start, play south, jump.") is None
    True
    """
    start = text.find(LESSON_MOVES)
    if start < 0:
        return None
    body, _, rest = text[start + len(LESSON_MOVES):].partition(".")
    moves = [m.strip() for m in body.split(",", MAX_LESSON_MOVES)]
    if len(moves) > MAX_LESSON_MOVES or not all(m in MOVES for m in moves):
        return None
    return LessonPolicy(moves, break_off=rest.split("\n", 1)[0].strip().startswith(BREAK_OFF))
