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
Prefill and the learner's forward passes (queries longer than one token) keep transformers' SDPA.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

__all__ = ["GROUPED_DECODE", "grouped_decode_attention"]

GROUPED_DECODE = "crl_grouped_decode"
"""the ``attn_implementation`` name under which transformers finds ``grouped_decode_attention``"""


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
    if q_length != 1 or kv_heads == heads or (module.training and dropout > 0):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    # reshape, not view: CUDA's SDPA may return a layout whose heads do not merge by a view
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value,
                                                           attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, 1, heads, head_dim), None


# Registered once, at import: the attention for one-token queries, and SDPA's boolean masks
# (which ``grouped_decode_attention`` takes for both of its paths).
AttentionInterface.register(GROUPED_DECODE, grouped_decode_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_DECODE, sdpa_mask)
