"""What one training step logs: success, reward and pairs (all, guided, free, per env), the
rollouts, the learners' updates, the bank and the released code's gate and asks.

Holds ``step_metrics``, the metrics of one step as ``MetricsLogger`` (``metrics``) writes them,
from the step's trajectories, the learners' ``UpdateStats`` and the step's timings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from crl_harness.eval import paired_difference
from crl_harness.experience import CRITIC_SCORES, episode_credit, gated_credit
from crl_harness.rollout import Trajectory
from crl_harness.training.learner import UpdateStats
from crl_harness.training.metrics import short_env_name

if TYPE_CHECKING:
    from crl_harness.config import TrainConfig

__all__ = ["step_metrics"]


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def _guided_free_pairs(trajectories: Sequence[Trajectory],
                       prefix: str = "pairs") -> dict[str, float]:
    """Guided against free inside the same groups, as the counts of a ``PairedDifference``
    (A free, B guided): the j-th guided episode of a group is paired with its j-th free one
    (same level, same weights), so summing the counts over steps and runs pools the pairs."""
    by_group: dict[int, tuple[list[bool], list[bool]]] = defaultdict(lambda: ([], []))
    for t in trajectories:
        by_group[t.group_id][0 if t.use_experience else 1].append(t.won)
    pairs = [(g, f) for guided, free in by_group.values()
             for g, f in zip(guided, free, strict=False)]  # an env failure leaves one unpaired
    d = paired_difference([f for _, f in pairs], [g for g, _ in pairs])
    return {f"{prefix}/guided_free": d.n, f"{prefix}/free_wins": d.a_wins,
            f"{prefix}/guided_wins": d.b_wins, f"{prefix}/free_only": d.only_a,
            f"{prefix}/guided_only": d.only_b}


def _format_failure_rate(trajectories: Sequence[Trajectory]) -> float:
    """Replies outside the answer format over the turns played."""
    return sum(t.format_failures for t in trajectories) / max(sum(t.steps for t in trajectories), 1)


def _env_metrics(trajectories: Sequence[Trajectory], uses_experience: bool) -> dict[str, float]:
    """Per env of the mixture (``short_env_name``): ``success/ENV``, ``format_failure_rate/ENV``
    (``_format_failure_rate``, as ``rollout/format_failure_rate``) and, in the arms that use
    experience, ``success/ENV/guided`` and ``success/ENV/free``."""
    by_env: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_env[short_env_name(t.env_id)].append(t)
    m: dict[str, float] = {}
    for env, part in by_env.items():
        m[f"success/{env}"] = _mean([float(t.won) for t in part])
        m[f"format_failure_rate/{env}"] = _format_failure_rate(part)
        if uses_experience:
            for name, flag in (("guided", True), ("free", False)):
                m[f"success/{env}/{name}"] = _mean([float(t.won) for t in part
                                                    if t.use_experience == flag])
    return m


def _gate_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The actor-critic gate's verdicts this step: their rates over the gated episodes, the
    malformed verdicts (counted as accept) and the mean credit given to the entries judged."""
    gated = [t for t in trajectories if t.gate is not None]
    m = {f"gate/{verdict}_rate": _mean([float(t.gate.verdict == verdict) for t in gated])
         for verdict in CRITIC_SCORES}
    m["gate/episodes"] = len(gated)
    m["gate/format_failures"] = sum(not t.gate.format_ok for t in gated)
    m["gate/entry_credit"] = _mean([gated_credit(t.outcome_score, t.gate.critic)
                                    for t in gated if t.experience_ids])
    return m


def _ask_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Search-and-ask this step: asks per guided episode (answered, refused, empty), queries
    cut, and the mean credit of the extractor generations that answered."""
    guided = [t for t in trajectories if t.use_experience]
    asks = [a for t in guided for a in t.asks]
    m = {"ask/per_episode": _mean([len(t.asks) for t in guided])}
    for status in ("answered", "refused", "empty"):
        m[f"ask/{status}"] = sum(a.status == status for a in asks)
    m["ask/queries_cut"] = sum(a.cut for a in asks)
    m["ask/answer_credit"] = _mean([episode_credit(t.outcome_score)
                                    for t in guided for a in t.asks if a.generation_id])
    return m


def step_metrics(cfg: TrainConfig, trajectories: Sequence[Trajectory],
                 actor: UpdateStats | None, extractor: UpdateStats | None,
                 times: Mapping[str, float], *, experience_stats: Mapping[str, Any] | None = None,
                 awaiting_training: int = 0, packed_fraction: float = float("nan"),
                 counters: Mapping[str, float] | None = None,
                 revisits: set[int] | None = None) -> dict[str, float]:
    """The metrics of one step of ``cfg``'s run (``cfg.uses_experience`` and the learners'
    ``max_logprob_gap``; the gate's and the asks' switches).

    ``actor`` / ``extractor``: their updates this step (None: not trained); ``times``: seconds
    per phase (``time/KEY``); ``experience_stats``: the experience service's ``stats()`` (None:
    the arm without experience); ``awaiting_training``: used extractor generations not trained
    yet; ``packed_fraction``: ``actor_rows``'; ``counters``: the run's running totals;
    ``revisits``: the groups whose level an earlier step played (``TaskDraw.revisit``): the
    guided - free pairs are also counted apart on them (``pairs_revisit/*``, where the bank may
    hold the level's lesson) and on first visits (``pairs_first/*``, where it cannot)."""
    m: dict[str, float] = {}
    won = [float(t.won) for t in trajectories]
    m["success/all"] = _mean(won)
    m["episodes/all"] = len(won)  # with the rates, pooled intervals over runs
    m["reward/all"] = _mean([t.reward for t in trajectories])
    if cfg.uses_experience:
        for name, flag in (("guided", True), ("free", False)):
            part = [t for t in trajectories if t.use_experience == flag]
            m[f"success/{name}"] = _mean([float(t.won) for t in part])
            m[f"episodes/{name}"] = len(part)
            m[f"reward/{name}"] = _mean([t.reward for t in part])
        m.update(_guided_free_pairs(trajectories))
        if revisits is not None:
            m.update(_guided_free_pairs([t for t in trajectories if t.group_id in revisits],
                                        "pairs_revisit"))
            m.update(_guided_free_pairs([t for t in trajectories if t.group_id not in revisits],
                                        "pairs_first"))
    m.update(_env_metrics(trajectories, cfg.uses_experience))
    m["rollout/format_failure_rate"] = _format_failure_rate(trajectories)
    m["rollout/generated_tokens"] = sum(t.generated_tokens for t in trajectories)
    m["rollout/episodes"] = len(trajectories)
    if actor is not None:
        m["loss/actor"] = actor.loss
        m["clip/actor"] = actor.clip_fraction
        m["grad_norm/actor"] = actor.grad_norm
        # sampler vs learner log-probs of the trained tokens, before the step
        m["actor/logprob_gap_mean"] = actor.logprob_gap_mean
        m["actor/logprob_gap_max"] = actor.logprob_gap_max
        m["actor/logprob_gap_over_bound"] = float(
            actor.logprob_gap_mean > cfg.actor.max_logprob_gap)
        # trajectories trained as one packed row (the rest: one row per turn)
        m["actor/packed_fraction"] = packed_fraction
    if extractor is not None:
        m["loss/extractor"] = extractor.loss
        m["clip/extractor"] = extractor.clip_fraction
        m["grad_norm/extractor"] = extractor.grad_norm
        m["extractor/trained_generations"] = extractor.rows
        m["extractor/logprob_gap_mean"] = extractor.logprob_gap_mean
        m["extractor/logprob_gap_max"] = extractor.logprob_gap_max
        m["extractor/logprob_gap_over_bound"] = float(
            extractor.logprob_gap_mean > cfg.extractor.max_logprob_gap)
    if experience_stats is not None:
        stats = experience_stats
        m["bank/size"] = stats["bank_size"]
        m["extractor/format_failures"] = stats["format_failures"]
        m["extractor/distillations"] = stats["distillations"]
        m["extractor/merges"] = stats["merges"]  # merge-pass chunks answered, as distillations
        m["extractor/buffered"] = awaiting_training
        m["experience/retrieved_per_guided"] = _mean(
            [len(t.experience_ids) for t in trajectories if t.use_experience])
        if cfg.experience.actor_critic_gate:
            m.update(_gate_metrics(trajectories))
        if cfg.experience.search_and_ask:
            m.update(_ask_metrics(trajectories))
            m["extractor/ask_format_failures"] = stats["ask_format_failures"]
    m.update(counters or {})
    for key, value in times.items():
        m[f"time/{key}"] = value
    return m
