"""The two losses of Complementary RL, written as the formulas of docs/method.md.

Holds:
- ``subgroup_advantages``: the actor's advantages, A = r - mean(r of the same subgroup), where a
  subgroup is the guided or the free half of one task seed's group (optional std normalisation).
- ``extractor_advantages``: the extractor's advantages, A = reward - batch mean.
- ``sequence_token_weights``: the per-token weights of "sequence-mean then batch-mean", so that a
  sequence split over several rows (multi-turn trajectories) or micro-batches aggregates exactly
  as if it were one row in one batch.
- ``grpo_loss``: PPO-clip (eps 0.2) per token, no KL, no entropy bonus.
- ``cispo_loss``: -sg[clip(ratio, 1-eps_low, 1+eps_high)] * A * log pi per token.
- ``sft_loss``: -log pi per target token (the warm start), same weights and signature.
- ``LossTerms``: what a loss returns (the scalar and its clip counts, for metrics).

Shapes: ``logprobs``, ``old_logprobs`` and ``mask`` are (rows, tokens); ``advantages`` is (rows,)
and is broadcast to every token of its row; ``token_weight`` is (rows,) (one weight per row, the
same for all its tokens). With ``token_weight=None`` each row is one sequence and the batch is
these rows.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "LossTerms",
    "subgroup_advantages",
    "extractor_advantages",
    "sequence_token_weights",
    "grpo_loss",
    "cispo_loss",
    "sft_loss",
]


@dataclass
class LossTerms:
    """A loss value and how many of its tokens were clipped.

    ``loss`` is the differentiable scalar; ``clipped_tokens`` and ``tokens`` are plain counts so
    that micro-batches add up to the clip fraction of the whole batch.
    """

    loss: torch.Tensor
    clipped_tokens: int
    tokens: int

    @property
    def clip_fraction(self) -> float:
        return self.clipped_tokens / self.tokens if self.tokens else 0.0


def subgroup_advantages(
    rewards: Sequence[float],
    subgroups: Sequence[Hashable],
    *,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """A_i = r_i - mean(r_j : j in the subgroup of i), optionally divided by that subgroup's std.

    ``subgroups[i]`` names the subgroup of rollout i, e.g. ``(group_id, use_experience)``: the
    guided and the free rollouts of one seed are normalised separately, so the guided ones cannot
    take the credit (docs/method.md). The std is the population std (a subgroup of one has A = 0).

    >>> subgroup_advantages([1, 0, 1, 1], [("g", False), ("g", False), ("g", True), ("g", True)])
    tensor([ 0.5000, -0.5000,  0.0000,  0.0000])
    """
    if len(rewards) != len(subgroups):
        raise ValueError(f"{len(rewards)} rewards but {len(subgroups)} subgroup keys")
    r = torch.as_tensor(rewards, dtype=torch.float32)
    advantages = torch.zeros_like(r)
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(subgroups):
        members.setdefault(key, []).append(i)
    for idx in members.values():
        r_sub = r[idx]
        a_sub = r_sub - r_sub.mean()
        if normalize_std:
            a_sub = a_sub / (r_sub.std(correction=0) + eps)
        advantages[idx] = a_sub
    return advantages


def extractor_advantages(
    rewards: Sequence[float], weights: Sequence[float] | None = None
) -> torch.Tensor:
    """A_i = reward_i - batch mean; with ``weights`` the mean is weighted (a generation repeated
    ``w`` times counts ``w`` times in the baseline, as it does in the loss).

    >>> extractor_advantages([1.0, -1.0, 0.0, 0.0])
    tensor([ 1., -1.,  0.,  0.])
    """
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if weights is None:
        return r - r.mean()
    w = torch.as_tensor(weights, dtype=torch.float32)
    return r - (w * r).sum() / w.sum()


def sequence_token_weights(
    tokens_per_sequence: torch.Tensor, sequence_weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Weight of each token of sequence s under "sequence-mean then batch-mean":
    ``sequence_weight[s] / tokens_per_sequence[s]``, with ``sequence_weight`` uniform over the
    sequences that have tokens (1 / their number) unless given; 0 for empty sequences.

    >>> sequence_token_weights(torch.tensor([2, 4, 0]))
    tensor([0.2500, 0.1250, 0.0000])
    """
    n = tokens_per_sequence.to(torch.float32)
    nonempty = n > 0
    if sequence_weight is None:
        sequence_weight = nonempty.to(torch.float32) / max(int(nonempty.sum()), 1)
    return torch.where(nonempty, sequence_weight / n.clamp(min=1.0), torch.zeros_like(n))


def _row_weights(mask: torch.Tensor, token_weight: torch.Tensor | None) -> torch.Tensor:
    if token_weight is None:
        token_weight = sequence_token_weights(mask.sum(dim=1))
    return token_weight.to(mask.dtype).unsqueeze(1)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    token_weight: torch.Tensor | None = None,
) -> LossTerms:
    """PPO-clip for both subgroups: per token -min(ratio * A, clip(ratio, 1-eps, 1+eps) * A),
    masked to the model-generated tokens, sequence-mean then batch-mean."""
    mask = mask.to(logprobs.dtype)
    A = advantages.to(logprobs.dtype).unsqueeze(1)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token_loss = -torch.minimum(ratio * A, clipped_ratio * A)
    loss = (per_token_loss * mask * _row_weights(mask, token_weight)).sum()
    # Clipping is active where the clipped term is the smaller one (its gradient is zero there).
    clipped = (clipped_ratio * A < ratio * A) & (mask > 0)
    return LossTerms(loss, int(clipped.sum()), int(mask.sum()))


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.1,
    eps_high: float = 0.1,
    token_weight: torch.Tensor | None = None,
) -> LossTerms:
    """CISPO: per token -sg[clip(ratio, 1-eps_low, 1+eps_high)] * A * log pi. Only the weight is
    clipped: every token still passes gradient through log pi."""
    mask = mask.to(logprobs.dtype)
    A = advantages.to(logprobs.dtype).unsqueeze(1)
    ratio = torch.exp(logprobs - old_logprobs)
    is_weight = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high).detach()
    per_token_loss = -is_weight * A * logprobs
    loss = (per_token_loss * mask * _row_weights(mask, token_weight)).sum()
    clipped = ((ratio < 1.0 - eps_low) | (ratio > 1.0 + eps_high)) & (mask > 0)
    return LossTerms(loss, int(clipped.sum()), int(mask.sum()))


def sft_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    token_weight: torch.Tensor | None = None,
) -> LossTerms:
    """Supervised fine-tuning (the warm start): negative log-likelihood of the target tokens,
    -sum(w * log pi) with the same weights as the RL losses (pass ``token_weight`` = 1 / all
    target tokens for a token-mean). ``old_logprobs`` and ``advantages`` are ignored: the
    signature is the learner's, so one ``PolicyLearner.update`` serves RL and SFT."""
    mask = mask.to(logprobs.dtype)
    loss = (-logprobs * mask * _row_weights(mask, token_weight)).sum()
    return LossTerms(loss, 0, int(mask.sum()))
