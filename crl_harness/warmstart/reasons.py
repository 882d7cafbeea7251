"""Short true reasons for an action, read from the observation the agent saw.

A warm-start target is ``<think>REASON</think><answer>ACTION</answer>``; the reason may only
state what the observation shows (where a seen goal lies, how many moves solve the grid), never
hidden state, and it is built by code, never free text. ``REASONS`` maps the env ids whose
oracles read only the observation (MiniHack, Sokoban) to their reason function; the others'
oracles use the episode's own solution (goal product, walkthrough, gold patch), so they have no
honest reason to give and cannot be warm-started this way.
"""

from __future__ import annotations

from collections.abc import Callable

from crl_envs.minihack.oracle import MOVES, parse_observation

__all__ = ["REASONS", "minihack_reason", "sokoban_reason", "random_reason"]


def minihack_reason(observation: str, action: str) -> str:
    """Why ``action`` from what a MiniHack observation shows.

    Example:
        >>> obs = ("Map (top-left cell is x=1, y=1; x grows east, y grows south):\\n     123\\n"
        ...        "     ...\\n   1 @.>\\n You (@) are at x=1, y=1. HP 12/12.")
        >>> minihack_reason(obs.replace(" You", "You"), "east")
        'I am at x=1, y=1; the stairs > are at x=3, y=1; east leads there.'
    """
    view = parse_observation(observation)
    if view is None:
        return f"I go on with {action}."
    hx, hy = view.hero
    here = f"I am at x={hx}, y={hy}"
    if action == "pickup":
        return f"{here}; the key ( lies here; I pick it up."
    if action.startswith("apply key"):
        return f"{here}; I carry the key and the locked door + is {action.split()[-1]}; I unlock it."
    if action in MOVES:
        dx, dy = MOVES[action]
        target = view.cells.get((hx + dx, hy + dy), "")
        if target.isalpha():
            return f"{here}; a monster ({target}) is {action} of me; I attack it."
    stairs = view.find(">")
    if stairs:
        sx, sy = min(stairs, key=lambda c: max(abs(c[0] - hx), abs(c[1] - hy)))
        return f"{here}; the stairs > are at x={sx}, y={sy}; {action} leads there."
    if "(" in view.cells.values() and "key" not in view.inventory:
        kx, ky = view.find("(")[0]
        return f"{here}; I need the key ( at x={kx}, y={ky} first; {action} leads there."
    if "+" in view.cells.values() and "key" in view.inventory:
        return f"{here}; I carry the key; {action} leads to the locked door +."
    if "}" in view.cells.values():
        return f"{here}; the stairs are not in sight and water blocks the way; {action} works " \
               "toward pushing a boulder into the water."
    return f"{here}; the stairs are not in sight; {action} explores unseen cells."


def sokoban_reason(observation: str, action: str) -> str:
    """Why ``action`` in a Sokoban grid: boxes placed and the moves a shortest solution needs.

    Example:
        >>> grid = "# # # # #\\n# P X O #\\n# # # # #\\nBoxes on targets: 0 of 1."
        >>> sokoban_reason(grid, "right")
        'Boxes on targets: 0 of 1; a shortest solution takes 1 moves from here; it starts right.'
    """
    from crl_envs.sokoban.level import Level
    from crl_envs.sokoban.solver import solve

    placed = next((line.rstrip(".") for line in observation.splitlines()
                   if line.startswith("Boxes on targets")), "")
    try:
        plan = solve(Level.from_text(observation))
    except Exception:  # noqa: BLE001 - an unreadable grid: say nothing it does not show
        plan = None
    prefix = f"{placed}; " if placed else ""
    if not plan:
        return f"{prefix}I try {action}."
    return f"{prefix}a shortest solution takes {len(plan)} moves from here; it starts {plan[0]}."


def random_reason(observation: str, action: str) -> str:
    """The reason of a noise turn: a try, with no claim about the state."""
    return f"I try {action}."


REASONS: dict[str, Callable[[str, str], str]] = {
    "CRL/MiniHackRoom-v0": minihack_reason,
    "CRL/MiniHackMaze-v0": minihack_reason,
    "CRL/MiniHackKeyRoom-v0": minihack_reason,
    "CRL/MiniHackRiver-v0": minihack_reason,
    "CRL/Sokoban-v0": sokoban_reason,
}
