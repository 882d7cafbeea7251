"""KV-cache reuse for the HF backend.

Holds:
- ``KVLayout``: the shape of one token's keys and values for a model (layers, KV heads, head dim).
- ``PrefixStore``: token-id sequences that were already run through the model, with their keys and
  values; a prompt is looked up by its longest common prefix with any stored sequence, and entries
  are evicted least-recently-used under a cap on stored tokens.
- ``SlabCache``: a transformers ``Cache`` over one buffer allocated per batch, so a decode step
  writes its keys in place instead of copying the whole cache as ``DynamicCache``'s ``torch.cat``
  does (at 32 rows x 2,000 tokens that copy is gigabytes per step).

Why reuse is exact: a token's keys and values depend only on the tokens before it and on its
position, so the cached part of a prompt equals what a fresh prefill would compute, up to
floating-point summation order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import Cache, DynamicLayer

__all__ = ["KVLayout", "PrefixStore", "SlabCache", "StoredPrefix"]


@dataclass(frozen=True)
class KVLayout:
    """Per-token key/value shape of a decoder: ``layers x 2 x kv_heads x head_dim`` numbers."""

    layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> KVLayout:
        """The layout of a transformers config; only plain full-attention decoders qualify."""
        config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError(f"KV reuse supports full-attention decoders only; this model has "
                             f"layer types {sorted(kinds)}. Load it with kv_reuse=False.")
        heads = config.num_attention_heads
        return cls(layers=config.num_hidden_layers,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads)

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype.itemsize


@dataclass(eq=False)  # identity, not array equality, decides which entry is which
class StoredPrefix:
    """Token ids already run through the model and their keys/values ``[layers, 2, heads, n, dim]``.

    ``shared`` marks a prefix computed once for several prompts of a batch (a system prompt, a
    GRPO group's first observation): it is not dropped when one episode extends it.
    """

    ids: np.ndarray
    kv: torch.Tensor
    shared: bool = False
    last_used: int = 0

    @property
    def tokens(self) -> int:
        return len(self.ids)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixStore:
    """Stored prefixes of one backend, bounded by ``max_tokens`` (least recently used go first).

    Example:
        >>> store = PrefixStore(max_tokens=8)
        >>> store.add([1, 2, 3], torch.zeros(1, 2, 1, 3, 4))
        >>> entry, reuse = store.lookup([1, 2, 9, 9])
        >>> reuse, store.tokens
        (2, 3)
        >>> store.add([5, 6, 7, 8, 9, 10], torch.zeros(1, 2, 1, 6, 4))  # 9 tokens > 8: evict
        >>> store.tokens, len(store)
        (6, 1)
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}.")
        self.max_tokens = max_tokens
        self.entries: list[StoredPrefix] = []
        self.tokens = 0
        self._clock = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, ids: list[int] | np.ndarray) -> tuple[StoredPrefix | None, int]:
        """The entry sharing the longest prefix with ``ids`` and that prefix's length."""
        ids = np.asarray(ids, dtype=np.int64)
        best, best_len = None, 0
        for entry in self.entries:
            length = common_prefix(entry.ids, ids)
            if length > best_len:
                best, best_len = entry, length
        if best is not None:
            self._clock += 1
            best.last_used = self._clock
        return best, best_len

    def add(self, ids: list[int] | np.ndarray, kv: torch.Tensor, *, shared: bool = False,
            replaces: StoredPrefix | None = None) -> None:
        """Store ``ids`` with ``kv``; ``replaces`` (the episode's previous entry, a prefix of
        ``ids``) is dropped unless it is shared. Evicts least recently used entries to fit."""
        ids = np.asarray(ids, dtype=np.int64)
        if replaces is not None and not replaces.shared and replaces in self.entries:
            self._remove(replaces)
        if len(ids) == 0 or len(ids) > self.max_tokens:
            return
        for entry in self.entries:  # the same sequence again (a repeated prompt): keep one
            if len(entry.ids) == len(ids) and common_prefix(entry.ids, ids) == len(ids):
                entry.shared = entry.shared or shared
                return
        while self.entries and self.tokens + len(ids) > self.max_tokens:
            self._remove(min(self.entries, key=lambda e: e.last_used))
            self.evictions += 1
        self._clock += 1
        self.entries.append(StoredPrefix(ids, kv, shared, self._clock))
        self.tokens += len(ids)

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0

    def _remove(self, entry: StoredPrefix) -> None:
        self.entries.remove(entry)
        self.tokens -= entry.tokens


class _SlabLayer(DynamicLayer):
    """One layer's view of the slab: ``keys``/``values`` are ``[batch, heads, capacity, dim]``
    buffers of which the first ``length`` columns are in use.

    A pass that continues the cache (a decode step, a prefill after reused columns) shows
    attention the whole buffer, as transformers' static cache does (the mask covers ``capacity``
    columns; those not yet written are masked, and must hold finite numbers): a contiguous
    tensor, where the first ``length`` columns alone would be a strided view that a CPU matrix
    product copies whole before every decode step. A pass into an empty cache sees its own
    columns only, so that unpadded rows keep the causal kernel that needs no mask."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        super().__init__()
        self.keys, self.values, self.length = keys, values, length
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        start, self.length = self.length, end
        if start == 0:
            return self.keys[:, :, :end], self.values[:, :, :end]
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # as ``update`` will return them (transformers asks before the pass writes its columns)
        return (query_length if self.length == 0 else self.keys.shape[-2]), 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.keys.shape[-2]


class SlabCache(Cache):
    """A batch's KV cache in one preallocated tensor ``[layers, 2, batch, heads, capacity, dim]``.

    ``length`` columns are already filled (the reused prefixes, right-aligned, with unused columns
    masked out by the attention mask); each forward pass appends its tokens in place. Columns not
    yet written must hold finite numbers (attention reads the whole buffer, masked).
    """

    def __init__(self, slab: torch.Tensor, length: int) -> None:
        self.slab = slab
        super().__init__(layers=[_SlabLayer(slab[i, 0], slab[i, 1], length)
                                 for i in range(slab.shape[0])])

    @property
    def length(self) -> int:
        return self.layers[0].length

    def keep_rows(self, keep: list[int]) -> list[int]:
        """Keep only rows ``keep`` (ascending; finished answers leave the batch) and return the
        new row order: new row i is old row ``order[i]``.

        The kept rows end up in the slab's first ``len(keep)`` rows, each kept row past that
        moved into the slot of a row that left, so the cache stays a view of the one buffer and
        a finished row costs one row's copy, not the whole slab's (an index_select of every
        layer's keys and values at each finish was gigabytes per decode turn).

        >>> cache = SlabCache(torch.arange(5.0).view(1, 1, 5, 1, 1, 1).repeat(1, 2, 1, 1, 2, 1), 2)
        >>> order = cache.keep_rows([1, 3, 4])
        >>> order, cache.slab[0, 0, :, 0, 0, 0].tolist()
        ([3, 1, 4], [3.0, 1.0, 4.0])
        """
        n = len(keep)
        kept = set(keep)
        free = [row for row in range(n) if row not in kept]
        movers = [row for row in keep if row >= n]
        order = list(range(n))
        for slot, row in zip(free, movers, strict=True):
            self.slab[:, :, slot] = self.slab[:, :, row]
            order[slot] = row
        length = self.length
        self.slab = self.slab[:, :, :n]
        for i, layer in enumerate(self.layers):
            layer.keys, layer.values, layer.length = self.slab[i, 0], self.slab[i, 1], length
        return order

    def row_kv(self, row: int, columns: torch.Tensor) -> torch.Tensor:
        """A copy of one row's keys/values at ``columns``: ``[layers, 2, heads, n, dim]``."""
        return self.slab[:, :, row].index_select(-2, columns)
