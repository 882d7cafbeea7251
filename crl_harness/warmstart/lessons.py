"""Transferable lessons in the actor's warm-start episodes (``warmstart.lesson_fraction``).

A route lesson is one level's; a transferable one holds for every level of a retrieval key (a
dark MiniHack Room's sweep from the start cell, broken off for the stairs once they are in view).
Its form and its policy live in the env package (``crl_envs.transferable_lesson``,
``crl_envs.lesson_policy``); here they become warm-start data. Holds ``KeyLessons`` (the env's
lesson of a level's key, as an experience entry) and ``LessonTurns`` (the turns of an episode
that follows one: the policy's actions and the reasons said for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import crl_envs
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.rollout import make_env
from crl_harness.warmstart.reasons import REASONS, break_off_reason
from crl_harness.warmstart.routes import route_moves

__all__ = ["KeyLessons", "LessonTurns"]


class KeyLessons:
    """The env's transferable lesson (``crl_envs.transferable_lesson``) of a level's retrieval
    key within its step limit, as an entry (id ``lesson-SEED``), or None where the env writes
    none; the key is read from a reset of one env, made at the first level asked about."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None,
                 options: dict[str, Any] | None) -> None:
        self.env_id, self.env_kwargs, self.options = env_id, env_kwargs or {}, options
        self.env: Any = None

    def __call__(self, seed: int) -> ExperienceEntry | None:
        return self.keyed(seed)[1]

    def keyed(self, seed: int) -> tuple[str, ExperienceEntry | None]:
        """The level's retrieval key and its lesson (None where the env writes none)."""
        if self.env is None:
            self.env = make_env(self.env_id, None, 1, **self.env_kwargs)
        _, info = self.env.reset(seed=seed, options=dict(self.options or {}) or None)
        key = str(info.get("retrieval_query") or info.get("task") or "")
        written = crl_envs.transferable_lesson(self.env_id, key, self.env.spec.max_episode_steps)
        return key, ExperienceEntry(f"lesson-{seed}", self.env_id, *written) if written else None

    def close(self) -> None:
        if self.env is not None:
            self.env.close()


class LessonTurns:
    """An episode that follows ``lesson`` (the form ``crl_envs.transferable_lesson`` writes) by
    its policy (``crl_envs.lesson_policy``). ``next`` gives a turn's action and reason: the
    lesson's moves ("The lesson from my start cell: move 2 of 5 is south."; on the first turn,
    after the ``advice_check``: "...: mine; the lesson's move 1 of 5 is east."), on the turn the
    goal comes into view (where the lesson says to break off) ``break_off_reason``, on the walk
    after it the env's own reasons; None once the policy says no more, and from then on.

    >>> sweep = ExperienceEntry("e", "CRL/MiniHackRoom-v0", "Winning moves from x=37, y=11",
    ...                         "from the start, play east. Once the staircase down (>) is in "
    ...                         "view, stop and walk to it.")
    >>> turns = LessonTurns("CRL/MiniHackRoom-v0", sweep)
    >>> turns.next("You (@) are at x=37, y=11.", [], None)  # no map: the stairs are not seen
    ('east', 'The lesson from my start cell: move 1 of 1 is east.')
    >>> turns.next("You (@) are at x=38, y=11.", [], None) is None
    True
    """

    def __init__(self, env_id: str, lesson: ExperienceEntry) -> None:
        self.env_id = env_id
        self.policy = crl_envs.lesson_policy(env_id, lesson.content)
        if self.policy is None:
            raise ValueError(f"{lesson.id} states no lesson that {env_id}'s lesson policy reads")
        self.moves = len(route_moves(lesson.content) or ())
        self.played = 0  # the lesson's moves played so far
        self.broke_off = False  # the lesson was left for the goal in view

    def next(self, observation: str, earlier: Sequence[str],
             check: str | None) -> tuple[str, str] | None:
        action = self.policy(observation) if self.policy is not None else None
        if action is None:
            self.policy = None  # the moves are spent: the policy is not asked again
            return None
        # only a policy that breaks off for the goal has ``to_goal``
        if not getattr(self.policy, "to_goal", False):
            self.played += 1
            said = f"move {self.played} of {self.moves} is {action}."
            return action, (f"{check}: mine; the lesson's {said}" if check
                            else f"The lesson from my start cell: {said}")
        if self.broke_off:
            return action, REASONS[self.env_id](observation, action, earlier)
        self.broke_off = True
        return action, break_off_reason(self.env_id)
