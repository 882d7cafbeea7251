"""An episode as plain text (the extractor's input).

Holds ``transcript_of`` and ``_gate_line`` (the actor-critic gate's verdict as one line).
A transcript names the level by its retrieval key and ends with one line of moves (a won
route's shortest walk to the goal, else the moves played):
a lesson about the level is then written by copying lines, which a small extractor does
reliably, where reading the key out of the first map and the moves out of six turns it did not.
"""

from __future__ import annotations

from collections.abc import Sequence

from crl_envs import winning_route
from crl_harness.rollout.records import GateRecord, Turn

__all__ = ["transcript_of"]


def _gate_line(gate: GateRecord) -> str:
    if gate.verdict == "reject":
        return "[Lessons] the agent rejected the lessons it was given and played without them"
    if gate.verdict == "refine":
        return f"[Lessons] the agent refined the lessons it was given into: {gate.knowledge}"
    return "[Lessons] the agent accepted the lessons it was given"


def transcript_of(task: str, turns: Sequence[Turn], won: bool, score: float,
                  gate: GateRecord | None = None, level: str = "", env_id: str = "") -> str:
    """The episode as plain text: task, the level's retrieval key (``level``, when the env gives
    one), the gate's verdict when there was one, then each observation and action (or ask), for a won episode of an env whose goal is a place
    the shortest route to it that the observations show (``crl_envs.winning_route``: the played
    moves without their detours and wall bumps), else the moves played, in one line; then the
    outcome."""
    lines = [f"Task: {task}"] if task else []
    if level:
        lines.append(f"Level: {level}")
    if gate is not None:
        lines.append(_gate_line(gate))
    for index, turn in enumerate(turns, start=1):
        lines.append(f"[Observation {index}]\n{turn.observation}")
        if turn.ask is not None:
            action = f"(asked the knowledge base: {turn.ask.query})"
        else:
            action = turn.action if turn.format_ok else "(reply not in the answer format)"
        lines.append(f"[Action {index}] {action}")
    route = winning_route(env_id, [t.observation for t in turns]) if won and env_id else None
    if route:
        # one line of moves to copy: beside a "[Moves played]" line with detours, the warm
        # extractor mixed the two and dropped a route's last move (add right 7 of 12 greedy)
        lines.append(f"[Shortest route to the goal] {', '.join(route)}")
    else:
        moves = [t.action for t in turns if t.ask is None and t.format_ok and t.action]
        lines.append(f"[Moves played] {', '.join(moves) if moves else '(none)'}")
    lines.append(f"[Outcome] {'success' if won else 'failure'} (score {score:g})")
    return "\n".join(lines)
