"""The actor's GRPO and the extractor's CISPO against numbers computed by hand, gradients included."""

from __future__ import annotations

import math

import pytest
import torch

from crl_harness.training.losses import (
    cispo_loss,
    extractor_advantages,
    grpo_loss,
    sequence_token_weights,
    sft_loss,
    subgroup_advantages,
)

# Two rows; row 0 has a padded third token. Ratios are chosen so that clipping shows.
RATIOS = torch.tensor([[1.0, 1.5, 0.7], [0.5, 1.1, 1.3]])
LOGPROBS = torch.tensor([[-1.0, -2.0, -0.5], [-0.5, -1.5, -3.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
ADVANTAGES = torch.tensor([2.0, -1.0])


def _inputs():
    logprobs = LOGPROBS.clone().requires_grad_(True)
    old_logprobs = LOGPROBS - torch.log(RATIOS)
    return logprobs, old_logprobs


def test_subgroup_advantages_separate_guided_and_free():
    rewards = [1, 0, 0, 0, 1, 1, 1, 0, 0, 1]
    keys = [("a", False)] * 4 + [("a", True)] * 4 + [("b", False)] * 2
    adv = subgroup_advantages(rewards, keys)
    # free of a: mean 0.25; guided of a: mean 0.75; free of b: mean 0.5
    expected = [0.75, -0.25, -0.25, -0.25, 0.25, 0.25, 0.25, -0.75, -0.5, 0.5]
    assert torch.allclose(adv, torch.tensor(expected))


def test_subgroup_advantages_std_normalisation():
    adv = subgroup_advantages([1, 0, 0, 0, 3, 3], ["f", "f", "f", "f", "g", "g"], normalize_std=True)
    std = math.sqrt(0.1875)  # population std of [1, 0, 0, 0]
    expected = [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0.0, 0.0]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-4)


def test_subgroup_advantages_length_mismatch():
    with pytest.raises(ValueError, match="2 rewards but 1"):
        subgroup_advantages([1, 0], ["a"])


def test_grpo_loss_and_gradient_by_hand():
    logprobs, old_logprobs = _inputs()
    terms = grpo_loss(logprobs, old_logprobs, ADVANTAGES, MASK, clip_eps=0.2)
    # row 0 (A=2): min(1*2, 1*2)=2, min(1.5*2, 1.2*2)=2.4 (clipped) -> mean -2.2
    # row 1 (A=-1): min(-.5, -.8)=-.8 (clipped), -1.1, -1.3 -> mean (0.8+1.1+1.3)/3
    expected = (-2.2 + 3.2 / 3) / 2
    assert terms.loss.item() == pytest.approx(expected, abs=1e-5)
    assert (terms.clipped_tokens, terms.tokens) == (2, 5)
    terms.loss.backward()
    # d/dlogp of -ratio*A is -A*ratio, times the token weight 1/(n_row * n_rows); clipped -> 0
    expected_grad = torch.tensor([[-2 * 1.0 / 4, 0.0, 0.0], [0.0, 1.1 / 6, 1.3 / 6]])
    assert torch.allclose(logprobs.grad, expected_grad, atol=1e-5)


def test_cispo_loss_and_gradient_by_hand():
    logprobs, old_logprobs = _inputs()
    terms = cispo_loss(logprobs, old_logprobs, ADVANTAGES, MASK, eps_low=0.1, eps_high=0.1)
    # weights clip(ratio, 0.9, 1.1): row 0 [1.0, 1.1], row 1 [0.9, 1.1, 1.1]
    # row 0: -w*2*logp = [2, 4.4] -> 3.2;  row 1: w*logp = [-.45, -1.65, -3.3] -> -1.8
    assert terms.loss.item() == pytest.approx((3.2 - 1.8) / 2, abs=1e-5)
    assert (terms.clipped_tokens, terms.tokens) == (3, 5)
    terms.loss.backward()
    # the weight is detached: gradient is -w*A/(n_row*n_rows), clipped tokens included
    expected_grad = torch.tensor([[-2 / 4, -1.1 * 2 / 4, 0.0], [0.9 / 6, 1.1 / 6, 1.1 / 6]])
    assert torch.allclose(logprobs.grad, expected_grad, atol=1e-5)


def test_cispo_asymmetric_clip():
    logprobs, old_logprobs = _inputs()
    terms = cispo_loss(logprobs, old_logprobs, ADVANTAGES, MASK, eps_low=0.6, eps_high=1.0)
    assert terms.clipped_tokens == 0  # every ratio in [0.4, 2.0]


def test_extractor_advantages_one_sample_per_generation():
    # the paper's form: A = reward - batch mean, every generation counted once
    adv = extractor_advantages([1.0, -1.0, 0.5, -1.0])
    assert torch.allclose(adv, torch.tensor([1.125, -0.875, 0.625, -0.875]))


def test_recomputed_old_logprobs_make_the_ratio_one_and_keep_the_gradient():
    """Old log-probs recomputed by the learner, before its step: the ratio is 1, nothing is
    clipped, and both losses reduce to the policy gradient -A * grad log pi (sequence-mean)."""
    for loss in (grpo_loss, cispo_loss):
        logprobs = LOGPROBS.clone().requires_grad_(True)
        terms = loss(logprobs, logprobs.detach(), ADVANTAGES, MASK)
        terms.loss.backward()
        assert terms.clipped_tokens == 0
        expected = -ADVANTAGES[:, None] * MASK / MASK.sum(dim=1, keepdim=True) / 2
        assert torch.allclose(logprobs.grad, expected)


def test_extractor_advantages_weighted_baseline():
    # weights [3, 1]: baseline (3*1 + 1*(-1))/4 = 0.5
    adv = extractor_advantages([1.0, -1.0], weights=[3, 1])
    assert torch.allclose(adv, torch.tensor([0.5, -1.5]))


def test_sequence_token_weights_with_sequence_weights():
    w = sequence_token_weights(torch.tensor([2, 5]), torch.tensor([0.75, 0.25]))
    assert torch.allclose(w, torch.tensor([0.375, 0.05]))


@pytest.mark.parametrize("loss_fn", [grpo_loss, cispo_loss])
def test_split_sequences_and_microbatches_match_one_batch(loss_fn):
    """A sequence cut into turns over two micro-batches gives the loss and gradient of the whole."""
    torch.manual_seed(0)
    lp = torch.randn(2, 6) * 0.3 - 1
    old = lp + torch.randn(2, 6) * 0.2
    adv = torch.tensor([1.0, -0.5])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])

    whole = lp.clone().requires_grad_(True)
    loss_fn(whole, old, adv, mask).loss.backward()

    # rows: seq0 tokens 0-2, seq0 tokens 3-5, seq1 tokens 0-2; micro-batches [row0, row2] and [row1]
    parts = lp.clone().requires_grad_(True)
    rows_lp = [parts[0, :3], parts[0, 3:], parts[1, :3]]
    rows_old = [old[0, :3], old[0, 3:], old[1, :3]]
    rows_mask = [mask[0, :3], mask[0, 3:], mask[1, :3]]
    per_seq = sequence_token_weights(mask.sum(dim=1))
    row_seq = [0, 0, 1]
    total = 0.0
    for batch in ([0, 2], [1]):
        terms = loss_fn(
            torch.stack([rows_lp[i] for i in batch]),
            torch.stack([rows_old[i] for i in batch]),
            adv[[row_seq[i] for i in batch]],
            torch.stack([rows_mask[i] for i in batch]),
            token_weight=per_seq[[row_seq[i] for i in batch]],
        )
        terms.loss.backward()
        total += terms.loss.item()
    assert total == pytest.approx(loss_fn(lp, old, adv, mask).loss.item(), abs=1e-6)
    assert torch.allclose(parts.grad, whole.grad, atol=1e-6)


def test_sft_loss_is_weighted_nll_of_the_masked_tokens_by_hand():
    weights = torch.tensor([0.2, 0.1])
    terms = sft_loss(LOGPROBS, LOGPROBS * 0 + 9.0, ADVANTAGES, MASK, token_weight=weights)
    by_hand = 0.2 * (1.0 + 2.0) + 0.1 * (0.5 + 1.5 + 3.0)  # row 0's third token is padding
    assert terms.loss.item() == pytest.approx(by_hand)
    assert (terms.tokens, terms.clipped_tokens) == (5, 0)
