"""The attention a query that continues a cache takes: the same values and gradients as SDPA
with the keys repeated per group, and no NaN where a padding row attends nothing."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from crl_harness.models import attention


def _case(q_length: int, length: int, dtype: torch.dtype = torch.float32):
    torch.manual_seed(0)
    query = torch.randn(2, 6, q_length, 8, dtype=dtype, requires_grad=True)
    key = torch.randn(2, 2, length, 8, dtype=dtype, requires_grad=True)
    value = torch.randn(2, 2, length, 8, dtype=dtype, requires_grad=True)
    # row 0 continues a cache of length - q_length tokens; row 1 is left-padded by 3 keys
    mask = torch.ones(q_length, length, dtype=torch.bool).tril(diagonal=length - q_length)
    mask = mask[None, None].repeat(2, 1, 1, 1)
    mask[1, :, :, :3] = False
    return query, key, value, mask


def _sdpa(query, key, value, mask):
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1),
        attn_mask=mask)
    return out.transpose(1, 2)


def test_continuation_attention_gives_sdpas_values_and_gradients():
    query, key, value, mask = _case(3, 9)
    out = attention.continuation_attention(query, key, value, mask)
    grads = torch.autograd.grad(out.square().sum(), (query, key, value))
    ref = _sdpa(query, key, value, mask)
    ref_grads = torch.autograd.grad(ref.square().sum(), (query, key, value))
    assert torch.allclose(out, ref, atol=1e-5)
    for got, want in zip(grads, ref_grads, strict=True):
        assert torch.allclose(got, want, atol=1e-5)


def test_a_query_that_attends_nothing_gets_no_nan():
    query, key, value, mask = _case(2, 6)
    mask[0, :, 0] = False  # padding: a query row with every key masked
    out = attention.continuation_attention(query, key, value, mask)
    assert not out.isnan().any()


def test_grouped_decode_attention_takes_the_continuation_path_only_against_a_long_cache(
        monkeypatch):
    """A decode step and a short query against a long cache take it; a query at least half as
    long as its keys keeps SDPA's causal kernel."""
    taken = []
    real = attention.continuation_attention
    monkeypatch.setattr(attention, "continuation_attention",
                        lambda *a, **k: taken.append(1) or real(*a, **k))
    module = SimpleNamespace(training=False, num_key_value_groups=3, is_causal=True)
    for q_length, length, expected in ((1, 9, 1), (3, 9, 1), (5, 9, 0), (9, 9, 0)):
        query, key, value, mask = _case(q_length, length)
        taken.clear()
        out, _ = attention.grouped_decode_attention(module, query, key, value, mask)
        assert len(taken) == expected
        assert torch.allclose(out, _sdpa(query, key, value, mask), atol=1e-5)
    query, key, value, _ = _case(1, 9)  # a decode step of unpadded rows: no mask at all
    taken.clear()
    out, _ = attention.grouped_decode_attention(module, query, key, value, None)
    assert taken and torch.allclose(out, _sdpa(query, key, value, None), atol=1e-5)
