"""What an episode is and what was played in it: the records the rollout engine fills and the
trainer reads.

Holds:
- ``EpisodeSpec``: one episode to play (env and seed, GRPO group, guided or free slot, experience
  on or off);
- ``Turn``: one model reply, with the token ids, log-probs and loss mask the trainer needs;
- ``GateRecord``: the actor-critic gate's turn of an episode;
- ``Trajectory``: a finished episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from crl_harness.experience.ask import AskRecord
from crl_harness.experience.gate import Verdict

__all__ = ["EpisodeSpec", "Turn", "GateRecord", "Trajectory"]


@dataclass
class EpisodeSpec:
    """One episode to play: which env and seed, its GRPO group, its slot in the group (guided or
    free) and whether experience is on.

    The slot and the switch differ only in a training run's retrieval warm-up, when the guided
    slots play without experience (nothing is retrieved while the bank fills) and are still
    distilled:

    >>> EpisodeSpec("CRL/Sokoban-v0", 3, guided=True, use_experience=False).guided
    True
    """

    env_id: str
    seed: int
    group_id: int = 0
    use_experience: bool = False
    """experience is retrieved for this episode (the experience wrapper's per-episode switch);
    the GRPO subgroups and the guided/free metrics split by it"""
    options: dict[str, Any] | None = None
    """reset options (e.g. a split)"""
    guided: bool = False
    """the guided slot of its group (``tasks.guided_per_group`` of each): the trainer sends its
    trajectory to the Experience Manager to distil; false: a free slot"""


@dataclass
class Turn:
    """One model reply and what it did.

    ``input_ids`` / ``loss_mask`` give the training view: the prompt tokens (mask 0) followed by
    the generated tokens (mask 1, EOS included when the model stopped by itself).

    Example:
        >>> t = Turn(prompt_token_ids=[5, 6], token_ids=[7, 2], logprobs=[-0.5, -0.1], text="x")
        >>> t.input_ids, t.loss_mask
        ([5, 6, 7, 2], [0, 0, 1, 1])
    """

    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    action: str | None = None
    format_ok: bool = True
    action_valid: bool = True
    reward: float = 0.0  # the env's reward for this step (0 where the env did not step)
    format_penalty: float = 0.0  # the rollout's penalty for a reply out of format (training shaping)
    finish_reason: str = ""
    observation: str = ""  # what the agent saw before this reply
    ask: AskRecord | None = None  # set when the reply asked the knowledge base (no env step)
    usage_tokens: int = 0  # the reply's tokens as a server counted them, where no ids came back

    @property
    def generated_tokens(self) -> int:
        """The reply's tokens: its ids, else the server's count."""
        return len(self.token_ids) or self.usage_tokens

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_token_ids + self.token_ids

    @property
    def loss_mask(self) -> list[int]:
        return [0] * len(self.prompt_token_ids) + [1] * len(self.token_ids)


@dataclass
class GateRecord:
    """The actor-critic gate's turn of an episode: the actor's verdict on the experience shown,
    its critic score (accept 1, refine 0.5, reject -1; a malformed reply is accept with
    ``format_ok`` false), the restated experience (refine) and the reply itself, which the actor
    is trained on with the episode's advantage."""

    verdict: Verdict
    critic: float
    turn: Turn
    knowledge: str = ""
    format_ok: bool = True


@dataclass
class Trajectory:
    """A finished episode.

    ``group_id``, ``use_experience`` and ``guided`` are its spec's (``Trajectory.of``).
    ``task_id`` names the task (the env's ``info["task_id"]``, else ``ENV_ID:SEED``), and
    ``retrieval_key`` the level as retrieval looks it up (the env's ``info["retrieval_query"]``
    at reset, empty where it gives none).
    ``reward`` is the episode return (the turns' env rewards plus their format penalties, each
    kept apart on its ``Turn``), ``won`` and ``score``
    the env's verdict, ``steps`` the number of agent turns that count toward the step limit
    (answered asks do not), ``experience_ids`` the bank entries shown to the agent (for the
    extractor's credit; kept when the gate rejected them) and ``experience`` their text as
    retrieved, ``gate`` the actor-critic gate's turn,
    ``transcript`` the episode as text (the extractor's input), ``system`` the system prompt a
    model agent saw (empty for scripted agents), ``final_observation`` what the env showed after
    the last action. ``error`` is set when the env itself failed; such an episode is not a
    sample of the policy.
    """

    env_id: str
    seed: int
    group_id: int = 0
    use_experience: bool = False
    guided: bool = False
    task: str = ""
    task_id: str = ""
    retrieval_key: str = ""
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    won: bool = False
    score: float = 0.0
    steps: int = 0
    experience_ids: list[str] = field(default_factory=list)
    experience: str = ""
    transcript: str = ""
    format_failures: int = 0
    invalid_actions: int = 0
    terminated: bool = False
    truncated: bool = False
    error: str = ""
    gate: GateRecord | None = None
    system: str = ""
    final_observation: str = ""

    @classmethod
    def of(cls, spec: EpisodeSpec, **fields: Any) -> Trajectory:
        """The trajectory of ``spec`` before it is played (its env, seed, group, slot and
        experience switch), with ``fields`` set.

        >>> Trajectory.of(EpisodeSpec("CRL/Sokoban-v0", 3, group_id=1, guided=True)).guided
        True
        """
        return cls(spec.env_id, spec.seed, spec.group_id, spec.use_experience,
                   guided=spec.guided, **fields)

    @property
    def outcome_score(self) -> float:
        """The episode's score as credit and metrics count it: 1 for a win, else the env's.

        >>> Trajectory("CRL/WebShop-v0", 0, won=True, score=0.5).outcome_score
        1.0
        """
        return 1.0 if self.won else float(self.score)

    @property
    def generated_tokens(self) -> int:
        gate = self.gate.turn.generated_tokens if self.gate is not None else 0
        return gate + sum(t.generated_tokens for t in self.turns)

    @property
    def asks(self) -> list[AskRecord]:
        """The episode's ask turns, answered or not."""
        return [t.ask for t in self.turns if t.ask is not None]
