"""The records an eval keeps of each episode: its transcript, and its attempt read back.

Holds:
- ``transcript_record`` and ``append_transcript``: one episode as a JSON line (who played what,
  each turn's prompt, reply and action, the outcome), flushed to disk at once;
- ``RecordedTrajectory`` / ``recorded_trajectory``: an attempt read back from a results file,
  for ``crl eval --resume``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_harness.experience.entries import clean_text
from crl_harness.results import Attempt, ResultsFormatError
from crl_harness.rollout import Trajectory

__all__ = ["transcript_record", "append_transcript", "RecordedTrajectory", "recorded_trajectory"]


def transcript_record(traj: Trajectory, agent: str) -> dict[str, Any]:
    """One episode as a JSON-ready record: who played what, the system prompt, and each turn's
    prompt (the observation), reply, action, reward and validity, then the outcome.

    Example:
        >>> from crl_harness.rollout import Turn
        >>> traj = Trajectory("CRL/Sokoban-v0", 3, won=True, steps=1, turns=[Turn(
        ...     [], [], [], text="up", action="up", observation="map", reward=1.0)])
        >>> record = transcript_record(traj, "scripted")
        >>> record["seed"], record["turns"][0]["reply"], record["turns"][0]["reward"]
        (3, 'up', 1.0)
    """
    return {
        "env_id": traj.env_id, "seed": traj.seed, "task_id": traj.task_id, "agent": agent,
        "task": traj.task, "use_experience": traj.use_experience,
        "experience_ids": traj.experience_ids, "system": traj.system,
        "turns": [{"observation": t.observation, "reply": t.text, "action": t.action,
                   "format_ok": t.format_ok, "action_valid": t.action_valid, "reward": t.reward,
                   "finish_reason": t.finish_reason, "generated_tokens": t.generated_tokens,
                   **({"ask": t.ask.query} if t.ask is not None else {})}
                  for t in traj.turns],
        "final_observation": traj.final_observation, "won": traj.won, "reward": traj.reward,
        "score": traj.score, "steps": traj.steps, "terminated": traj.terminated,
        "truncated": traj.truncated, "error": traj.error,
    }


def append_transcript(path: str | Path, record: dict[str, Any]) -> None:
    """Append one transcript record as a JSON line and flush it to disk. Its text is made valid
    Unicode first (``clean_text``): a lone surrogate, which a server's JSON escape ``\\ud800``
    produces, cannot be written as UTF-8."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = clean_text(json.dumps(record, ensure_ascii=False)) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


@dataclass
class RecordedTrajectory(Trajectory):
    """A finished episode read back from a results file (no turns): what ``--resume`` counts."""

    recorded_tokens: int = 0

    @property
    def generated_tokens(self) -> int:
        return self.recorded_tokens


def recorded_trajectory(attempt: Attempt) -> RecordedTrajectory:
    """The summary fields of an episode an earlier run appended to the results file.

    Example:
        >>> traj = recorded_trajectory(Attempt("t", True, steps=5, seed=2, env_id="E",
        ...                                    extra={"generated_tokens": 40}))
        >>> traj.env_id, traj.seed, traj.won, traj.generated_tokens
        ('E', 2, True, 40)
    """
    return RecordedTrajectory(
        attempt.env_id, attempt.seed if attempt.seed is not None else -1, task_id=attempt.task_id,
        won=attempt.won, reward=attempt.reward, score=attempt.score, steps=attempt.steps,
        format_failures=_count(attempt, "format_failures"),
        invalid_actions=_count(attempt, "invalid_actions"),
        truncated=_flag(attempt, "truncated"),
        recorded_tokens=_count(attempt, "generated_tokens"))


def _count(attempt: Attempt, key: str) -> int:
    """The whole number >= 0 that ``crl eval`` wrote under ``key`` (0 where absent), or a
    ``ResultsFormatError`` naming the episode."""
    value = attempt.extra.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ResultsFormatError(f"the attempt of {attempt.env_id} seed {attempt.seed}: {key} "
                                 f"must be a whole number >= 0, got {str(value)[:40]!r}")
    return value


def _flag(attempt: Attempt, key: str) -> bool:
    """The true/false that ``crl eval`` wrote under ``key`` (false where absent), or a
    ``ResultsFormatError`` naming the episode."""
    value = attempt.extra.get(key, False)
    if not isinstance(value, bool):
        raise ResultsFormatError(f"the attempt of {attempt.env_id} seed {attempt.seed}: {key} "
                                 f"must be true or false, got {str(value)[:40]!r}")
    return value
