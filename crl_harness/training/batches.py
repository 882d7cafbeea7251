"""A step's batch of trajectories, as the actor trains on it (the bank is credited from it by
``crl_harness.experience.credit_episodes``).

Holds ``actor_rows`` (the GRPO rows of a step: advantages inside each (seed, guided/free)
subgroup, one row per trajectory when its prompts only grow, else one per turn, with the token
weights of "sequence-mean then batch-mean").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from crl_harness.rollout import Trajectory
from crl_harness.training.learner import TrainingRow
from crl_harness.training.losses import sequence_token_weights, subgroup_advantages
from crl_harness.training.packing import pack_turns

__all__ = ["actor_rows"]


def actor_rows(trajectories: Sequence[Trajectory], *,
               normalize_std: bool) -> tuple[list[TrainingRow], float]:
    """One row per trajectory when its prompts only grow (``pack_turns``), else one per
    turn; either way every row of a trajectory carries its token weight, the trajectory
    being the sequence of "sequence-mean then batch-mean".

    Returns the rows and the fraction of the trajectories trained that were packed (NaN when
    none is trained). ``normalize_std``: ``actor.normalize_std`` (``subgroup_advantages``)."""
    packed_fraction = float("nan")  # of the trajectories trained this step
    if not trajectories:
        return [], packed_fraction
    advantages = subgroup_advantages(
        [t.reward for t in trajectories],
        [(t.group_id, t.use_experience) for t in trajectories],
        normalize_std=normalize_std)
    weights = sequence_token_weights(
        torch.tensor([t.generated_tokens for t in trajectories]))
    rows, trained, packed = [], 0, 0
    for traj, advantage, weight in zip(trajectories, advantages.tolist(), weights.tolist(),
                                       strict=True):
        if advantage == 0.0:  # contributes exactly nothing to the loss or its gradient
            continue
        parts = pack_turns(traj.turns)
        trained += bool(parts)
        packed += bool(parts) and parts[0].packed
        # The gate's verdict is a chat of its own (not a prefix of the episode's): one more
        # row, with the episode's advantage, so the actor learns to judge experience too.
        if traj.gate is not None:
            parts += pack_turns([traj.gate.turn])
        rows.extend(TrainingRow(p.prompt_ids, p.completion_ids, p.old_logprobs, advantage,
                                weight, p.completion_mask) for p in parts)
    if trained:
        packed_fraction = packed / trained
    return rows, packed_fraction

