"""Route lessons: "from the start, play MOVES", keyed by where a level starts.

Holds ``route_advice`` (the lesson a won attempt teaches: the experience entry "winning moves of
an earlier attempt at this level"), its inverse ``route_of``, ``route_moves`` (the moves of a
route lesson inside any text), ``advice_check`` (the sentence that sets the lesson's key beside
the level's) and ``winning_route`` (the shortest route a won attempt's observations show).
"""

from __future__ import annotations

import crl_envs
from crl_envs.minihack.oracle.lessons import LESSON_MOVES as _ROUTE_CONTENT
from crl_envs.minihack.oracle.lessons import LESSON_TITLE as _ROUTE_TITLE
from crl_envs.minihack.render import level_key
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.rollout import Trajectory

# The form's phrases are declared once, in crl_envs, where the transferable lessons are written.
__all__ = ["route_advice", "route_content", "route_of", "route_moves", "advice_check", "winning_route"]


def route_advice(env_id: str, start_observation: str, moves: list[str],
                 entry_id: str = "advice", task: str = "", key: str = "") -> ExperienceEntry:
    """The lesson "from the start, play MOVES", keyed by where the episode started.

    The title carries what the next episode at this level retrieves with, so that it finds this
    entry: the level's retrieval ``key`` (``Trajectory.retrieval_key``: Sokoban's goal and
    layout; MiniHack's ``level_key`` of the start observation, found from it when not given),
    else the episode's ``task`` (WebShop's instruction, ALFWorld's task sentence: the key of envs
    whose levels differ by task). Levels with one shared task (Sokoban) need their key, or every
    lesson of the env has one title.

    >>> route_advice("CRL/WebShop-v0", "WebShop [SEP] ...", ["search[red mug]", "click[buy now]"],
    ...              task="Find me a red mug").title
    'Winning moves for: Find me a red mug'
    """
    key = key or level_key(start_observation)
    title = (f"{_ROUTE_TITLE}{key}" if key
             else f"Winning moves for: {task}" if task else "Winning moves of this level")
    return ExperienceEntry(entry_id, env_id, title, route_content(moves))


def route_content(moves: list[str]) -> str:
    return f"{_ROUTE_CONTENT}{', '.join(moves)}."



def route_of(entry: ExperienceEntry) -> tuple[str, list[str]] | None:
    """The level key and the moves of a keyed lesson ``route_advice`` writes (its inverse);
    ``None`` for any other entry (a lesson in words, a title without a key).

    >>> route_of(route_advice("CRL/MiniHackRoom-v0", "You (@) are at x=39, y=9.", ["west", "south"]))
    ('x=39, y=9; in view: nothing notable', ['west', 'south'])
    >>> route_of(ExperienceEntry("e", "CRL/MiniHackRoom-v0", "Walls", "Avoid the walls.")) is None
    True
    """
    if not entry.title.startswith(_ROUTE_TITLE) or not entry.content.startswith(_ROUTE_CONTENT):
        return None
    moves = [m.strip() for m in entry.content.removeprefix(_ROUTE_CONTENT).rstrip(".").split(",")]
    return (entry.title.removeprefix(_ROUTE_TITLE), moves) if all(moves) else None


def route_moves(text: str) -> list[str] | None:
    """The moves of the first route lesson (``route_advice``'s form) inside ``text`` (an
    experience block, an entry's text); None where it holds none.

    >>> route_moves("Winning moves from x=39, y=9: from the start, play west, south.")
    ['west', 'south']
    >>> route_moves("Walls: avoid them.") is None
    True
    """
    start = text.find(_ROUTE_CONTENT)
    if start < 0:
        return None
    body = text[start + len(_ROUTE_CONTENT):].split("\n", 1)[0].strip()
    moves = [m.strip() for m in body.split(".", 1)[0].split(",")]
    return moves if all(moves) else None


def advice_check(entry: ExperienceEntry, observation: str) -> str | None:
    """Whether a route lesson fits the level, said the way the actor can check it: the start
    cell (and what was in view there) of the first observation, then the lesson title's, so that
    the two stand side by side before the reply decides (": mine" or ": set aside"; with the
    advice's cell written before its own, an actor sampling at T=0.99 set its own level's lesson
    aside in 6 of 32 episodes of a probe). ``None`` where the title or the observation carries no
    MiniHack level key.

    >>> entry = route_advice("CRL/MiniHackRoom-v0", "You (@) are at x=39, y=9. HP 12/12.", ["west"])
    >>> advice_check(entry, "You (@) are at x=38, y=12. HP 12/12.")
    'I start at x=38, y=12; the advice is from x=39, y=9'
    """
    mine = level_key(observation)
    if mine is None or not entry.title.startswith(_ROUTE_TITLE):
        return None
    theirs = entry.title.removeprefix(_ROUTE_TITLE)
    my_cell, _, my_view = mine.partition("; in view: ")
    their_cell, _, their_view = theirs.partition("; in view: ")
    if their_cell != my_cell or theirs == mine:
        return f"I start at {my_cell}; the advice is from {their_cell}"
    return f"I start at {my_cell} seeing {my_view}; the advice saw {their_view}"


def winning_route(trajectory: Trajectory) -> list[str]:
    """The moves from the start to the goal that a won attempt's observations show.

    MiniHack Room and Maze: a shortest walk from the start over the floor cells the attempt saw
    (``crl_envs.winning_route``: exploring in the dark wanders; the lesson should not), the
    route the transcript's "[Shortest route to the goal]" line states. Otherwise (Sokoban): the
    attempt's own moves.
    """
    route = crl_envs.winning_route(trajectory.env_id, [t.observation for t in trajectory.turns])
    return route or [t.action or "" for t in trajectory.turns]
