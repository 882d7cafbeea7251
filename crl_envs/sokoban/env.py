"""``SokobanEnv``: Sokoban as a text environment (registered as ``CRL/Sokoban-v0``).

Holds ``SokobanEnv``. Each reset generates a fresh 6x6 level with two boxes from the seeded rng
(``generator.generate_level``), or plays the level given as ``options={"level": text}``.

Rules worth knowing (also in ``instructions``):
- ``up``/``down``/``left``/``right`` move the player one cell; walking into a box pushes it when
  the cell behind the box is free floor or target.
- Walking into a wall, or pushing a box into a wall or another box, is a valid move that changes
  nothing; the status line says so ("You bump into a wall."). It costs a step like any move.
- Anything else is an invalid no-op step (``info["action_valid"] is False``) whose observation
  names the four actions and repeats the grid.
- Reward 1 (and ``terminated``) exactly when every box is on a target; the step limit comes from
  gymnasium's ``TimeLimit`` (30 in the registration), so running out is ``truncated``.
- ``info["score"]`` is the fraction of boxes on targets.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from crl_envs.base import TextEnv, Transition
from crl_envs.sokoban.generator import (
    DEFAULT_MAX_SOLUTION_LENGTH,
    DEFAULT_MIN_SOLUTION_LENGTH,
    generate_level,
)
from crl_envs.sokoban.level import DIRECTIONS, LEGEND, Level, LevelFormatError

__all__ = ["SokobanEnv"]

ACTIONS: list[str] = [name for name, _, _ in DIRECTIONS]


class SokobanEnv(TextEnv):
    """Push every box onto a target in a small room, reading and writing plain text.

    Args:
        dim_room: the whole grid (height, width), outer wall included; the paper's 6x6 by default.
        num_boxes: boxes (and targets) per level.
        min_solution_length, max_solution_length: bounds on the optimal number of moves of a
            generated level (defaults 4 and 20: every level fits the 30-step limit with 10 spare).
        render_mode: ``None`` or ``"ansi"``.
        reward_mode: ``"binary"`` (1 on success) or ``"score"`` (the fraction of boxes placed,
            paid on the winning step, so also 1).

    Example:
        >>> env = SokobanEnv()
        >>> obs, info = env.reset(seed=0)
        >>> info["task"], info["admissible_actions"]
        ('Push both boxes onto the two targets.', ['up', 'down', 'left', 'right'])
        >>> obs, reward, terminated, truncated, info = env.step("move up")
        >>> info["action_valid"], reward, terminated
        (False, 0.0, False)
    """

    # The retrieval key (the layout) names the level exactly.
    metadata = {**TextEnv.metadata, "retrieval_key": "exact"}

    env_id = "CRL/Sokoban-v0"

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 2,
        min_solution_length: int = DEFAULT_MIN_SOLUTION_LENGTH,
        max_solution_length: int = DEFAULT_MAX_SOLUTION_LENGTH,
        render_mode: str | None = None,
        reward_mode: str = "binary",
    ) -> None:
        super().__init__(render_mode=render_mode, reward_mode=reward_mode)
        self._generation = dict(
            dim_room=tuple(dim_room),
            num_boxes=num_boxes,
            min_solution_length=min_solution_length,
            max_solution_length=max_solution_length,
        )
        # Fail at construction, not at the first reset, when the bounds cannot be met.
        generate_level(np.random.default_rng(0), **self._generation)
        self.num_boxes = num_boxes
        self.instructions = _instructions(num_boxes)
        self.level: Level | None = None
        self._start_layout: str | None = None

    @property
    def task(self) -> str:
        count = self.level.num_boxes if self.level is not None else self.num_boxes
        if count == 1:
            return "Push the box onto the target."
        if count == 2:
            return "Push both boxes onto the two targets."
        return f"Push all {count} boxes onto the {count} targets."

    @property
    def retrieval_query(self) -> str | None:
        """Every level with the same box count has the same goal: the key is the goal and the
        level's starting layout, kept for the whole episode (the goal's words find lessons
        written in words; BM25 reads no positions in a grid of symbols, dense retrieval does)."""
        return None if self._start_layout is None else f"{self.task}\n{self._start_layout}"

    def admissible_actions(self) -> list[str]:
        return list(ACTIONS)

    # ----------------------------------------------------------------- episode
    def _reset(self, seed: int | None, options: dict[str, Any]) -> str:
        if "level" in options:
            self.level = _level_from_option(options["level"])
        else:
            self.level = generate_level(self.np_random, **self._generation)
        self._start_layout = self.level.to_text()
        return self._observation("A new level begins.")

    def _step(self, action: str) -> Transition:
        assert self.level is not None
        name = self.normalize_action(action)
        if name not in ACTIONS:
            shown = action if len(action) <= 40 else action[:40] + "..."
            invalid = self.invalid(
                f"{shown!r} is not a move. Answer with exactly one word.", ACTIONS
            )
            invalid.observation += "\n" + self.level.to_text()
            return invalid
        level, event = _move(self.level, ACTIONS.index(name))
        self.level = level
        return Transition(
            observation=self._observation(event),
            won=level.is_solved,
            terminated=level.is_solved,
            score=level.boxes_on_targets / level.num_boxes,
        )

    def _observation(self, event: str) -> str:
        assert self.level is not None
        placed, total = self.level.boxes_on_targets, self.level.num_boxes
        status = (
            f"{event} All {total} boxes are on targets: solved!"
            if self.level.is_solved
            else f"{event} Boxes on targets: {placed} of {total}."
        )
        return f"{self.level.to_text()}\n{status}"


def _move(level: Level, direction: int) -> tuple[Level, str]:
    """Apply one move; return the new level and what happened, in words."""
    name = ACTIONS[direction]
    step = level.neighbours[direction]
    to = step[level.player]
    if to < 0:
        return level, "You bump into a wall."
    if not level.boxes >> to & 1:
        return replace(level, player=to, solution_length=None), f"You move {name}."
    box_to = step[to]
    if box_to < 0:
        return level, "The box is against a wall and does not move."
    if level.boxes >> box_to & 1:
        return level, "The box is against another box and does not move."
    boxes = level.boxes ^ (1 << to) ^ (1 << box_to)
    landed = " onto a target" if level.targets >> box_to & 1 else ""
    moved = replace(level, player=to, boxes=boxes, solution_length=None)
    return moved, f"You push a box {name}{landed}."


def _level_from_option(value: Any) -> Level:
    if isinstance(value, Level):
        return value
    if not isinstance(value, str):
        raise TypeError(f"options['level'] must be a Level or its text, got {type(value).__name__}.")
    try:
        return Level.from_text(value)
    except LevelFormatError as err:
        raise ValueError(f"options['level'] is not a Sokoban level: {err}") from err


def _instructions(num_boxes: int) -> str:
    return (
        "You are playing Sokoban in a small room seen from above.\n"
        f"Goal: push all {num_boxes} boxes (X) onto the {num_boxes} targets (O). You win when "
        "every box is on a target.\n"
        "The grid is shown as rows of symbols separated by spaces, top row first:\n"
        f"{LEGEND}\n"
        "Actions: answer with exactly one word: up, down, left or right. A move walks one cell; "
        "walking into a box pushes it one cell if the cell behind it is floor or a target. "
        "Boxes cannot be pulled, and you cannot push two boxes at once. Walking into a wall, or "
        "pushing a box into a wall or another box, does nothing but still uses a step. "
        "A box pushed into a corner that is not a target can never be moved out.\n"
        "Reward: 1 when every box is on a target, 0 otherwise. Each move uses one step of "
        "a limited budget."
    )
