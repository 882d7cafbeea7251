"""Lessons replayed without a model: whether the lesson a guided episode was handed wins its level,
played as the policy it states where the env reads one (``crl_envs.lesson_policy``), else a
route's moves as they stand (``route_moves``: the lesson form the warm start teaches).

Holds ``LessonReplay``, which keeps one env per env id and replays the handed lessons of a step's
trajectories; the trainer logs the share that win (``lessons/replay_win_rate``): a lesson that
does not win replayed cannot help its guided episodes, whatever the actor does.
``LessonReplay.wins_following`` plays a lesson as the policy it states
(``crl_envs.lesson_policy``: a transferable lesson's sweep, broken off once the goal is in view),
on any level of its key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from crl_harness.rollout import Trajectory
from crl_harness.warmstart.routes import route_moves

__all__ = ["LessonReplay"]

MAX_REPLAYS_PER_STEP = 256  # a bound on the env time one step spends replaying lessons


class LessonReplay:
    """Replays the lessons handed to a step's guided episodes in the envs they were made for.

    Example:
        >>> from types import SimpleNamespace as T
        >>> replay = LessonReplay({"CRL/Sokoban-v0": {}})
        >>> replay.step_metrics([T(env_id="CRL/Sokoban-v0", seed=0, use_experience=True,
        ...                        experience="Walls: avoid them.", experience_ids=["e"])])
        {'lessons/handed': 0.0, 'lessons/replay_win_rate': nan}
        >>> replay.close()
    """

    def __init__(self, env_kwargs: dict[str, dict[str, Any]],
                 env_options: dict[str, dict[str, Any]] | None = None) -> None:
        self.env_kwargs = env_kwargs
        self.env_options = env_options or {}
        self._envs: dict[str, Any] = {}

    def wins(self, env_id: str, seed: int, moves: Sequence[str]) -> bool:
        """Whether ``moves`` from the reset of level ``seed`` of ``env_id`` reach a win."""
        left = iter(moves)
        return self._plays(env_id, seed, lambda _observation: next(left, None))

    def wins_following(self, env_id: str, seed: int, lesson: str) -> bool | None:
        """Whether the policy that ``lesson`` (an entry's text) states wins level ``seed`` of
        ``env_id``: its moves, and what it says to do once the goal is in view (a transferable
        lesson, ``crl_envs.transferable_lesson``); None where the env reads no policy in it."""
        import crl_envs

        policy = crl_envs.lesson_policy(env_id, lesson)
        return None if policy is None else self._plays(env_id, seed, policy)

    def _plays(self, env_id: str, seed: int, policy: Callable[[str], str | None]) -> bool:
        """Play ``policy`` (the observation in, an action or None to stop) from the reset of
        level ``seed`` until the episode ends (the env's step limit ends every one)."""
        env = self._envs.get(env_id)
        if env is None:
            import gymnasium as gym

            import crl_envs  # noqa: F401  (registers the ids)

            env = self._envs[env_id] = gym.make(env_id, **self.env_kwargs.get(env_id, {}))
        observation, _ = env.reset(seed=seed, options=self.env_options.get(env_id) or None)
        while (move := policy(observation)) is not None:
            observation, _, terminated, truncated, info = env.step(move)
            if terminated or truncated:
                return bool(info.get("won"))
        return False

    def step_metrics(self, trajectories: Sequence[Trajectory]) -> dict[str, float]:
        """``lessons/handed``: guided episodes handed a lesson this replay reads;
        ``lessons/replay_win_rate``: the share of those lessons that win their level replayed
        (nan when none)."""
        handed = [t for t in trajectories if t.use_experience and t.experience_ids]
        wins = [won for t in handed[:MAX_REPLAYS_PER_STEP]
                for won in [self.handed_wins(t.env_id, t.seed, t.experience)] if won is not None]
        return {"lessons/handed": float(len(wins)),
                "lessons/replay_win_rate": sum(wins) / len(wins) if wins else float("nan")}

    def handed_wins(self, env_id: str, seed: int, experience: str) -> bool | None:
        """Whether the lesson in ``experience`` (what an episode was shown) wins level ``seed``
        replayed: as the policy it states where the env reads one (a transferable lesson broken
        off for the goal, which its moves alone can walk past), else a route's moves as they
        stand; None where it holds neither."""
        won = self.wins_following(env_id, seed, experience)
        if won is None and (moves := route_moves(experience)):
            won = self.wins(env_id, seed, moves)
        return won

    def close(self) -> None:
        for env in self._envs.values():
            env.close()
        self._envs.clear()
