"""Short true reasons for an action, read from what the agent saw.

A warm-start target is ``<think>REASON</think><answer>ACTION</answer>``; the reason may only
state what the episode's observations show (where a seen goal lies, how many moves solve the
grid, which words of the instruction a result's title shares, where a needed object was seen),
never hidden state, and it is built by code, never free text. ``REASONS`` maps an env id to its
reason function ``reason(observation, action, earlier)``: ``earlier`` are the episode's earlier
observations, oldest first (what the agent has seen before this one).

- MiniHack, Sokoban (``minihack_reason``, ``sokoban_reason``): the oracles read only the
  observation, and so do the reasons.
- A reason is one short sentence, never a list of facts or a quoted text (MiniHack's, Sokoban's,
  ALFWorld's and a WebShop click's start with the act): greedy replies of a small model taught
  on lists loop one of their items to the token limit.
- WebShop, ALFWorld (``webshop_reason``, ``alfworld_reason``): the oracles act on privileged state
  (the goal product, the game's walkthrough); their actions are behaviour-cloning targets as in
  every published SFT baseline, but the reasons say only what the instruction, the task sentence
  and the observations so far show (a product is never called the goal, an object is never
  placed before it was seen).
- SWE-bench has none: its oracle applies the gold patch, which no observation explains.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from crl_envs.alfworld.env import TASK_PREFIX
from crl_envs.minihack.oracle import MOVES, parse_observation

__all__ = ["REASONS", "minihack_reason", "sokoban_reason", "webshop_reason", "alfworld_reason",
           "random_reason", "BREAK_OFF_REASONS", "break_off_reason"]


def minihack_reason(observation: str, action: str, earlier: Sequence[str] = ()) -> str:
    """Why ``action`` from what a MiniHack observation shows (``earlier`` is not needed): one
    clause that starts with the act and says what it heads for, never a list of facts (the
    mix3-cpu warm start taught on "I am at ...; the stairs > are at ...; east leads there."
    looped its middle clause to the token limit on 31.8% of held-out Room turns, greedy).

    Example:
        >>> obs = ("Map (top-left cell is x=1, y=1; x grows east, y grows south):\\n     123\\n"
        ...        "     ...\\n   1 @.>\\n You (@) are at x=1, y=1. HP 12/12.")
        >>> minihack_reason(obs.replace(" You", "You"), "east")
        'I move east from x=1, y=1 toward the stairs > at x=3, y=1.'
    """
    view = parse_observation(observation)
    if view is None:
        return f"I go on with {action}."
    hx, hy = view.hero
    if action == "pickup":
        return "I pick up the key ( that lies here."
    if action.startswith("apply key"):
        return f"I unlock the locked door + {action.split()[-1]} of me with the key I carry."
    if action not in MOVES:
        return f"I try {action}."
    dx, dy = MOVES[action]
    target = view.cells.get((hx + dx, hy + dy), "")
    if target.isalpha():
        return f"I attack the monster {target} {action} of me."
    move = f"I move {action} from x={hx}, y={hy}"
    stairs = view.find(">")
    if stairs:
        sx, sy = min(stairs, key=lambda c: max(abs(c[0] - hx), abs(c[1] - hy)))
        return f"{move} toward the stairs > at x={sx}, y={sy}."
    if "(" in view.cells.values() and "key" not in view.inventory:
        kx, ky = view.find("(")[0]
        return f"{move} toward the key ( at x={kx}, y={ky}, which I need first."
    if "+" in view.cells.values() and "key" in view.inventory:
        return f"{move} toward the locked door +, as I carry its key."
    if "}" in view.cells.values():
        return f"{move} to push a boulder into the water that blocks the way."
    return f"{move} to explore unseen cells, as the stairs are not in sight."


def sokoban_reason(observation: str, action: str, earlier: Sequence[str] = ()) -> str:
    """Why ``action`` in a Sokoban grid, as one clause that starts with the move: the moves a
    shortest solution needs from here (``earlier`` is not needed).

    Example:
        >>> grid = "# # # # # #\\n# P X _ O #\\n# # # # # #\\nBoxes on targets: 0 of 1."
        >>> sokoban_reason(grid, "right")
        'I move right, the first of 2 moves that solve the level from here.'
    """
    from crl_envs.sokoban.level import Level
    from crl_envs.sokoban.solver import solve

    try:
        plan = solve(Level.from_text(observation))
    except Exception:  # noqa: BLE001 - an unreadable grid: say nothing it does not show
        plan = None
    if not plan:
        return f"I try {action}."
    if plan[0] != action:
        return f"I move {action}, though a shortest solution from here starts {plan[0]}."
    if len(plan) == 1:
        return f"I move {action}, which solves the level."
    return f"I move {action}, the first of {len(plan)} moves that solve the level from here."

# --------------------------------------------------------------------------------- WebShop
_STOPWORDS = frozenset(
    "a an and are as at be by for from i in is it me my of on or than that the this to with "
    "find need want looking buy get show would like price lower dollars".split())
_LEADS = re.compile(r"^(?:find me|i need|i want|i am looking for|i'm looking for|looking for|"
                    r"get me|buy me|show me|i would like)\s+(?:(?:an?|some|the)\s+)?", re.I)
_NEUTRAL_CLICKS = {"next >": "I look at the next page of results.",
                   "< prev": "I go back to the previous page.",
                   "back to search": "I go back to the search page."}


def _segments(observation: str) -> list[str]:
    return [part.strip() for part in observation.split("[SEP]")]


def _instruction(observation: str) -> str:
    """The instruction a WebShop page shows (the text after "Instruction:")."""
    parts = _segments(observation)
    for i, part in enumerate(parts[:-1]):
        if part.endswith("Instruction:"):
            return parts[i + 1]
    return ""


def _words(text: str) -> list[str]:
    found = re.findall(r"[a-z0-9](?:[a-z0-9'.-]*[a-z0-9])?", text.lower())
    return [w for w in found if w not in _STOPWORDS]


def _what_is_asked(instruction: str, limit: int = 12) -> str:
    """The product an instruction asks for: its words before the attributes and the price."""
    what = _LEADS.sub("", instruction.strip())
    what = re.split(r"\s+with\s+|,?\s+and\s+price\b|,?\s+price\b", what, maxsplit=1)[0]
    words = what.strip(" ,.").split()
    return " ".join(words[:limit]) + (" ..." if len(words) > limit else "")


def webshop_reason(observation: str, action: str, earlier: Sequence[str] = ()) -> str:
    """Why ``action`` on a WebShop page, from the instruction and the page's text only.

    Example:
        >>> page = ("Instruction: [SEP] Find me gluten free snacks with flavor name: vanilla, "
        ...         "and price lower than 20.00 dollars [SEP] Back to Search [SEP] Page 1 "
        ...         "(Total results: 50) [SEP] Next > [SEP] B0ABCDEFGH [SEP] Vanilla Gluten "
        ...         "Free Bars [SEP] $9.99")
        >>> webshop_reason(page, "search[Find me gluten free snacks with flavor name: vanilla]")
        'The instruction asks for gluten free snacks; I search for it.'
        >>> webshop_reason(page, "click[b0abcdefgh]")
        'I open b0abcdefgh, whose title shares 3 words with the instruction.'
        >>> webshop_reason(page, "click[vanilla]")
        'The instruction asks for vanilla.'
        >>> webshop_reason(page, "click[next >]")
        'I look at the next page of results.'
    """
    match = re.fullmatch(r"(search|click)\[(.+)\]", action.strip())
    if match is None:
        return f"I try {action}."
    kind, argument = match.group(1), match.group(2).strip()
    instruction = _instruction(observation)
    if kind == "search":
        asked = set(_words(instruction))
        query = _words(argument)
        if query and sum(w in asked for w in query) >= len(query) / 2:
            return f"The instruction asks for {_what_is_asked(instruction)}; I search for it."
        return "I search again with other words."
    name = argument.lower()
    if name in _NEUTRAL_CLICKS:
        return _NEUTRAL_CLICKS[name]
    if name == "buy now":
        return "The options the instruction names are selected; I buy it."
    if name in ("description", "features", "reviews"):
        return f"I read the product's {name}."
    parts = _segments(observation)
    shown = [i for i, part in enumerate(parts[:-1]) if part.lower() == name]
    if shown and re.fullmatch(r"[a-z0-9]{10}", name):  # a product link: its title follows
        # A count, not the title or the words: a quoted title or a list of words taught greedy
        # replies to loop in them to the token limit on held-out levels.
        asked = set(_words(instruction))
        common = {w for w in _words(parts[shown[0] + 1]) if w in asked}
        if common:
            return f"I open {name}, whose title shares {len(common)} words with the instruction."
        return f"I open {name} to see its options."
    if name in instruction.lower():
        return f"The instruction asks for {name}."
    return f"I select {name}."


# --------------------------------------------------------------------------------- ALFWorld
_TASK_LINE = re.compile(rf"{re.escape(TASK_PREFIX)} (.+?)\.?\s*$", re.M)
_TASK_OBJECT = re.compile(r"^(?:put|find|clean|heat|cool|examine|look at)\s+(?:(?:a|an|two|some|"
                          r"the)\s+)?(?:(?:clean|hot|cool|cold)\s+)?(\w+)")
_TASK_TARGET = re.compile(r"\b(?:in|on|with|under)\s+(?:the\s+)?(\w+)$")
_ENTITY = r"([a-z]+ \d+)"
_TREATMENTS = {"clean": ("clean", "clean"), "heat": ("hot", "heat"), "cool": ("cool", "cool")}


def _article(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _kind(entity: str) -> str:
    """``"keychain 1"`` -> ``"keychain"``."""
    return entity.rsplit(" ", 1)[0]


@dataclass
class _Seen:
    """What an ALFWorld episode's observations show so far."""

    task: str = ""
    held: str | None = None
    visited: set[str] = field(default_factory=set)
    where: dict[str, str] = field(default_factory=dict)  # object -> the place it was seen at

    @classmethod
    def read(cls, texts: Sequence[str]) -> _Seen:
        seen = cls()
        for text in texts:
            task = _TASK_LINE.search(text)
            if task:
                seen.task = task.group(1).strip()
            place = re.search(rf"(?:You arrive at|You open the) {_ENTITY}", text)
            if place:
                seen.visited.add(place.group(1))
                contents = re.search(r"you see (.+?)\.(?:\s|$)", text)
                for thing in re.findall(rf"\ban? {_ENTITY}", contents.group(1) if contents else ""):
                    seen.where[thing] = place.group(1)
            taken = re.search(rf"You pick up the {_ENTITY} from", text)
            if taken:
                seen.held = taken.group(1)
                seen.where.pop(seen.held, None)
            put = re.search(rf"You (?:move|put) the {_ENTITY} (?:to|in|on|into|onto) the {_ENTITY}",
                            text)
            if put:
                seen.held = None
                seen.where[put.group(1)] = put.group(2)
        return seen


def alfworld_reason(observation: str, action: str, earlier: Sequence[str] = ()) -> str:
    """Why ``action`` in ALFWorld, from the task sentence and the episode's observations so far
    (what the agent holds, where it has looked, where it saw what): one clause that starts with
    the act and one that says why, never a list (a list of places, or a restatement of the task
    beside the act, taught greedy replies to loop to the token limit on held-out levels).

    Example:
        >>> start = ("You are in the middle of a room. Looking quickly around you, you see a "
        ...          "drawer 1, a ottoman 1, and a sidetable 1.\\n"
        ...          "Your task is to: put two keychain in ottoman.")
        >>> alfworld_reason(start, "go to sidetable 1")
        'I go to sidetable 1, where I have not looked for a keychain yet.'
        >>> seen = "You arrive at sidetable 1. On the sidetable 1, you see a keychain 1, and a vase 1."
        >>> alfworld_reason(seen, "take keychain 1 from sidetable 1", [start])
        'I take keychain 1, which I see here, as the task needs a keychain.'
        >>> took = "You pick up the keychain 1 from the sidetable 1."
        >>> alfworld_reason(took, "go to ottoman 1", [start, seen])
        'I go to ottoman 1 with keychain 1, which belongs in an ottoman.'
    """
    seen = _Seen.read([*earlier, observation])
    task = seen.task
    obj = _TASK_OBJECT.search(task)
    target = _TASK_TARGET.search(task)
    obj_kind = obj.group(1) if obj else "object"
    target_kind = target.group(1) if target else ""
    treat = next((verb for verb, (adj, _) in _TREATMENTS.items()
                  if re.search(rf"\b({verb}|{adj}|cold)\b" if verb == "cool" else
                               rf"\b({verb}|{adj})\b", task)), None)
    held = seen.held if seen.held and _kind(seen.held) == obj_kind else None
    act = action.strip()
    if act.startswith("go to "):
        place = act.removeprefix("go to ")
        if held:
            if treat and _kind(place) in ("sinkbasin", "microwave", "fridge") \
                    and _kind(place) != target_kind:
                adj, verb = _TREATMENTS[treat]
                return f"I go to {place} to {verb} {held}, as the task needs it {adj}."
            if target_kind and any(_kind(t) == target_kind and p == place
                                   for t, p in seen.where.items()):
                return f"I go to {place} with {held}, as I saw {_article(target_kind)} there."
            if _kind(place) == target_kind:
                return f"I go to {place} with {held}, which belongs in {_article(target_kind)}."
            return f"I go to {place} with {held}."
        here = [t for t, p in seen.where.items()
                if p == place and _kind(t) == obj_kind and _kind(p) != target_kind]
        if here:
            return f"I go to {place}, where I saw {here[0]}, as the task needs " \
                   f"{_article(obj_kind)}."
        if place in seen.visited:
            return f"I go back to {place}, which may hold {_article(obj_kind)}."
        return f"I go to {place}, where I have not looked for {_article(obj_kind)} yet."
    taken = re.fullmatch(rf"take {_ENTITY} from {_ENTITY}", act)
    if taken:
        thing, place = taken.groups()
        if _kind(thing) != obj_kind:
            return f"I take {thing} from {place}."
        where = "which I see here" if re.search(rf"\b{thing}\b", observation) \
            else f"which I saw at {place}"
        return f"I take {thing}, {where}, as the task needs {_article(obj_kind)}."
    put = re.fullmatch(rf"(?:move|put) {_ENTITY} (?:to|in|on|in/on) {_ENTITY}", act)
    if put:
        thing, place = put.groups()
        return f"I put {thing} in {place}, where the task wants it."
    treated = re.fullmatch(rf"(clean|heat|cool) {_ENTITY} with {_ENTITY}", act)
    if treated:
        verb, thing, tool = treated.groups()
        adj = _TREATMENTS[verb][0]
        return f"I {verb} {thing} with {tool}, as the task needs {_article(f'{adj} {obj_kind}')}."
    if act.startswith("open "):
        place = act.removeprefix("open ")
        closed = ", which is closed," if re.search(rf"{place} is closed", observation) else ""
        return f"I open {place}{closed} to look inside."
    if act.startswith("use "):
        lamp = act.removeprefix("use ")
        return f"I turn on {lamp} to look at {held or _article(obj_kind)} under it."
    if act.startswith(("close ", "examine ")):
        return f"I {act}."
    return f"I try {action}."


def random_reason(observation: str, action: str, earlier: Sequence[str] = ()) -> str:
    """The reason of a noise turn: a try, with no claim about the state."""
    return f"I try {action}."


_STAIRS_IN_VIEW = "The stairs > are in view: I leave the lesson and walk to them."
BREAK_OFF_REASONS: dict[str, str] = {
    "CRL/MiniHackRoom-v0": _STAIRS_IN_VIEW,
    "CRL/MiniHackMaze-v0": _STAIRS_IN_VIEW,
    "CRL/MiniHackKeyRoom-v0": _STAIRS_IN_VIEW,
    "CRL/MiniHackRiver-v0": _STAIRS_IN_VIEW,
}
"""the reason of the turn that breaks a transferable lesson off, by env: its goal came into view"""


def break_off_reason(env_id: str) -> str:
    """Why an episode leaves the lesson it followed: the goal is in view (the observation that
    the lesson's policy broke off on shows it), so it walks there.

    >>> break_off_reason("CRL/MiniHackRoom-v0")
    'The stairs > are in view: I leave the lesson and walk to them.'
    """
    return BREAK_OFF_REASONS.get(env_id, "The goal is in view: I leave the lesson and walk to it.")


REASONS: dict[str, Callable[[str, str, Sequence[str]], str]] = {
    "CRL/MiniHackRoom-v0": minihack_reason,
    "CRL/MiniHackMaze-v0": minihack_reason,
    "CRL/MiniHackKeyRoom-v0": minihack_reason,
    "CRL/MiniHackRiver-v0": minihack_reason,
    "CRL/Sokoban-v0": sokoban_reason,
    "CRL/WebShop-v0": webshop_reason,
    "CRL/ALFWorld-v0": alfworld_reason,
}
