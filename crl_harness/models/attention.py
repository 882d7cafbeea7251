"""Grouped-query decode attention that reads the KV cache in place.

Holds ``GROUPED_DECODE`` (the name the HF backend loads models with) and
``grouped_decode_attention``.

Why: transformers' SDPA path cannot use SDPA's own grouped-query support when an attention mask
is given on a CPU or CUDA device (``use_gqa_in_sdpa``), so every layer of every decode step
expands the cached keys and values from the model's KV heads to its query heads (``repeat_kv``:
3 -> 9 heads for SmolLM2-135M). At 32 rows x 900 tokens that is a 100 MB copy per layer and step,
which glibc serves with fresh mmaps: page faults on every step. The one-token query of a decode
step needs no copy: its ``heads`` query vectors, viewed as ``[batch, kv_heads, groups, head_dim]``,
are ``groups`` queries per KV head, and SDPA attends them to the unexpanded cache with the same
padding mask (a decode query sees every unmasked key, so no causal structure is lost).
On a CPU, a query that continues a cache at least ``CONTINUATION_RATIO`` times its length (the learner's
row that continues the row before it, a turn's prefill after the cached conversation) needs the
mask too, and the CPU flash kernel with a mask runs at about half its causal speed; its few
queries against many keys are two matrix products and a softmax on the same unexpanded cache
(``benchmarks/actor_update_bench.py --compare attention``). A CPU decode step takes the same two
products: in bf16 they run at about twice SDPA's pace for a few queries against a long
contiguous cache (32 rows, 900 keys: 1.3 against 2.3 ms a layer), in fp32 at its pace; the HF
backend's cache (``SlabCache``) hands attention its whole buffer, contiguous, for that. Other
queries keep transformers' SDPA.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = ["GROUPED_DECODE", "CONTINUATION_RATIO", "grouped_decode_attention",
           "continuation_attention"]

GROUPED_DECODE = "crl_grouped_decode"
"""the ``attn_implementation`` name under which transformers finds ``grouped_decode_attention``"""

CONTINUATION_RATIO = 2
"""a query of q tokens against at least this many times q keys takes ``continuation_attention``
(``benchmarks/actor_update_bench.py --compare attention``; at 1 the CPU flash kernel is faster)"""


def grouped_decode_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None,
                             dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``query [B, heads, q, D]``, ``key``/``value``
    ``[B, kv_heads, T, D]``, a boolean ``attention_mask [B, 1, q, T]`` (True: attend); returns
    ``([B, q, heads, D], None)``. One-token queries take the grouped path, others SDPA's.

    Example (equal to SDPA with the keys repeated per group):
        >>> import torch
        >>> from types import SimpleNamespace
        >>> q, k, v = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
        >>> mask = torch.tensor([[True] * 5, [False, False, True, True, True]])[:, None, None, :]
        >>> out, _ = grouped_decode_attention(SimpleNamespace(training=False), q, k, v, mask)
        >>> ref = torch.nn.functional.scaled_dot_product_attention(
        ...     q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), attn_mask=mask)
        >>> torch.allclose(out, ref.transpose(1, 2), atol=1e-6)
        True
    """
    batch, heads, q_length, head_dim = query.shape
    kv_heads = key.shape[1]
    if module.training and dropout > 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    # a decode step too (q = 1, with a padding mask or unpadded without one): in bf16 the two
    # products run at about twice the pace of SDPA's kernel there; a query of several tokens
    # without a mask is causal, so never those
    if query.device.type == "cpu" and key.shape[2] >= CONTINUATION_RATIO * q_length and (
            attention_mask is not None or q_length == 1):
        return continuation_attention(query, key, value, attention_mask, scaling), None
    if q_length != 1 or kv_heads == heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    # reshape, not view: CUDA's SDPA may return a layout whose heads do not merge by a view
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value,
                                                           attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, 1, heads, head_dim), None


def continuation_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                           attention_mask: torch.Tensor | None, scaling: float | None = None,
                           ) -> torch.Tensor:
    """Attention as two matrix products and a softmax (in fp32) on the unexpanded keys and
    values: ``query [B, heads, q, D]``, ``key``/``value`` ``[B, kv_heads, T, D]``, a boolean
    ``attention_mask [B, 1, q, T]`` (True: attend; a float one is added; None: every key, as
    a decode step of unpadded rows sees them); returns ``[B, q, heads, D]``. A query row with no
    key to attend (padding) gets the mean of the values, never a NaN.

    Example (equal to SDPA with the keys repeated per group):
        >>> import torch
        >>> q, k, v = torch.randn(1, 6, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
        >>> mask = torch.ones(3, 7, dtype=torch.bool).tril(diagonal=4)[None, None]
        >>> ref = torch.nn.functional.scaled_dot_product_attention(
        ...     q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), attn_mask=mask)
        >>> torch.allclose(continuation_attention(q, k, v, mask), ref.transpose(1, 2), atol=1e-6)
        True
    """
    batch, heads, q_length, head_dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = head_dim ** -0.5 if scaling is None else scaling
    # query heads kv*groups .. kv*groups+groups-1 share KV head kv (transformers' repeat_kv)
    scores = query.reshape(batch, kv_heads, groups * q_length, head_dim) @ key.transpose(-1, -2)
    scores = scores.view(batch, kv_heads, groups, q_length, length).float() * scale
    if attention_mask is not None:
        mask = attention_mask[:, :, None]  # [B, 1, 1, q, T]: the same for every head
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(torch.float32).min)
        else:
            scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = probs.view(batch, kv_heads, groups * q_length, length) @ value
    return out.view(batch, heads, q_length, head_dim).transpose(1, 2)


# Registered once, at import: the attention for one-token queries, and SDPA's boolean masks
# (which ``grouped_decode_attention`` takes for both of its paths).
AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_DECODE, sdpa_mask)
