"""Hugging Face transformers backend (CPU or GPU; any model id, local path or GGUF file).

Holds ``HFBackend``: the ``ModelBackend`` protocol, batching and KV reuse across calls; it loads
with ``crl_harness.models.hf_loading`` and decodes each batch with
``crl_harness.models.hf_generation``. ``sample_next_token``, ``resolve_dtype``, ``hub_reachable``
and ``cpu_computes_bf16`` are importable from here too (their home is one of those two).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from crl_harness.models.base import (
    KV_CACHE_TOKENS,
    Generation,
    Message,
    encode_chat,
    stop_token_ids,
)
from crl_harness.models.hf_generation import decode_batch, row_generators, sample_next_token
from crl_harness.models.hf_loading import (
    cpu_computes_bf16,
    hub_reachable,
    import_torch_transformers,
    load_pretrained,
    resolve_device,
    resolve_dtype,
)

__all__ = ["HFBackend", "sample_next_token", "resolve_dtype", "hub_reachable", "cpu_computes_bf16"]


class HFBackend:
    """A transformers causal LM behind the ``ModelBackend`` protocol.

    ``model`` and ``tokenizer`` are public: the trainer computes differentiable log-probs with
    them and updates ``model`` in place (so ``load_weights`` is only needed for other weights).
    ``max_batch_size`` bounds how many conversations one forward pass holds; prompts are sorted
    by length so that padding stays small.

    KV reuse (``kv_reuse=True``, the default): the keys and values of every prompt and answer are
    kept (``crl_harness.models.kv_cache.PrefixStore``), so the next turn of a multi-turn episode,
    whose prompt extends the last one, prefills only its new tokens; prefixes that several
    prompts of one batch share (a system prompt, a GRPO group) are computed once. A prompt that
    changed other than by appending reuses its longest stored common prefix. The store holds at
    most ``kv_cache_tokens`` tokens (least recently used evicted; SmolLM2-135M in fp32 takes
    46 KB a token, so the default 65,536 is 3 GB) and is emptied when the weights change: by
    any update autograd sees (an optimiser step, ``load_state_dict``, ``p.copy_`` under
    ``no_grad``). Weight sync contract: a write through ``.data`` (``vector_to_parameters``,
    ``p.data = ...``, ``p.data.add_()``) is invisible to it, so the writer calls
    ``clear_prefix_cache()`` after one (``load_weights`` does). ``kv_reuse=False`` prefills every
    prompt in full.

    Speed: decode steps attend with ``crl_harness.models.attention`` (grouped-query attention on
    the cache in place; ``attn_implementation="sdpa"`` is transformers' path, which copies the
    keys and values per step), and loading a backend keeps large blocks in the heap
    (``crl_harness.models.allocator``). ``dtype="bfloat16"`` runs in bf16 (AVX512-BF16 CPUs, GPUs);
    an adapter is merged in fp32 first.

    Example:
        >>> from crl_harness.models.tiny import build_tiny_model
        >>> import tempfile
        >>> backend = HFBackend(build_tiny_model(tempfile.mkdtemp()))
        >>> [g] = backend.generate([[{"role": "user", "content": "hi"}]], max_new_tokens=4,
        ...                        temperature=1.0, seed=0)
        >>> len(g.token_ids) == len(g.logprobs) <= 4
        True
    """

    MIN_SHARED_PREFIX = 16
    """tokens that prompts of a batch must share beyond the stored part to be prefilled once"""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_batch_size: int = 64,
        max_context: int | None = None,
        kv_reuse: bool = True,
        kv_cache_tokens: int = KV_CACHE_TOKENS,
        attn_implementation: str = "grouped_decode",
    ) -> None:
        torch, _ = import_torch_transformers()
        from crl_harness.models.allocator import keep_large_blocks_in_heap
        from crl_harness.models.attention import GROUPED_DECODE

        keep_large_blocks_in_heap()
        device = resolve_device(torch, device)
        dtype = resolve_dtype(dtype, device)
        if attn_implementation == "grouped_decode":
            attn_implementation = GROUPED_DECODE
        self.tokenizer, self.model, self.name = load_pretrained(
            path, gguf_file=gguf_file, dtype=dtype, attn_implementation=attn_implementation)
        self.model.to(device).eval()
        self.device = device
        self.max_batch_size = max_batch_size
        self.max_context = int(
            max_context or getattr(self.model.config, "max_position_embeddings", 2048)
        )
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else min(self.stop_ids)
        )
        if kv_cache_tokens < 1:
            raise ValueError(f"kv_cache_tokens must be >= 1, got {kv_cache_tokens}.")
        from crl_harness.models.kv_cache import KVLayout, PrefixStore

        self.kv_layout = KVLayout.of(self.model.config)
        self.kv_cache_tokens = kv_cache_tokens
        self.prefix_store = PrefixStore(kv_cache_tokens) if kv_reuse else None
        self.cache_stats = {"prefilled_tokens": 0, "reused_tokens": 0}
        self._seen_weights = self._weights_version()
        self._lock = threading.Lock()  # one batch at a time owns the model and the store

    # ----------------------------------------------------------------- protocol
    def count_tokens(self, messages: list[Message]) -> int:
        return len(encode_chat(self.tokenizer, messages))

    def generate(
        self,
        prompts: list[list[Message]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
    ) -> list[Generation]:
        return self.generate_from_ids(
            [encode_chat(self.tokenizer, messages) for messages in prompts],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
        )

    def generate_from_ids(
        self,
        prompt_ids: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] = (),
    ) -> list[Generation]:
        """``generate`` for prompts that are already token ids."""
        import torch

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        if not prompt_ids:
            return []
        if not all(prompt_ids):
            raise ValueError("Every prompt needs at least one token.")
        width = max(len(p) for p in prompt_ids)
        if width + max_new_tokens > self.max_context:
            raise ValueError(
                f"A prompt of {width} tokens plus {max_new_tokens} new tokens exceeds the model's "
                f"context of {self.max_context}; lower max_new_tokens, shorten the prompt (its "
                "system prompt, experience or observation), or use a model with a longer context."
            )
        generators = row_generators(
            seed if seed is not None else int(torch.randint(2**62, ()).item()), len(prompt_ids))
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        results: list[Generation | None] = [None] * len(prompt_ids)
        with self._lock:
            self._drop_stale_prefixes()
            for chunk in self._chunks([len(prompt_ids[i]) for i in order], max_new_tokens):
                indices = [order[i] for i in chunk]
                prompts = [prompt_ids[i] for i in indices]
                if self.prefix_store is not None:
                    self._share_prefixes(prompts)
                generations = decode_batch(self, prompts, max_new_tokens, temperature, top_p,
                                           [generators[i] for i in indices], stop=tuple(stop))
                for index, generation in zip(indices, generations, strict=True):
                    results[index] = generation
        return results  # type: ignore[return-value]

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Copy ``state_dict`` (e.g. the trainer's) into the model; every key must match."""
        self.model.load_state_dict(state_dict, strict=True)
        self.clear_prefix_cache()

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]

    # ----------------------------------------------------------------- KV reuse
    def clear_prefix_cache(self) -> None:
        """Forget every stored prefix (the next prompts are prefilled in full). Part of the
        weight sync: call it after writing weights through ``.data``, which no version counter
        records (stale keys and values would be reused otherwise)."""
        if self.prefix_store is not None:
            self.prefix_store.clear()

    def _weights_version(self) -> tuple[int, int]:
        # Every in-place change of a parameter (an optimiser step, load_state_dict, a LoRA adapter
        # being trained or added) bumps the parameters' version counters.
        params = list(self.model.parameters())
        return len(params), sum(p._version for p in params)

    def _drop_stale_prefixes(self) -> None:
        if self.prefix_store is None:
            return
        version = self._weights_version()
        if version != self._seen_weights:
            self.prefix_store.clear()
            self._seen_weights = version

    def _chunks(self, lengths: list[int], max_new_tokens: int) -> list[list[int]]:
        """Split the length-sorted batch so that no forward pass holds more than
        ``max_batch_size`` rows, nor (with KV reuse) more than ``kv_cache_tokens`` cache slots."""
        chunks: list[list[int]] = [[]]
        for i, length in enumerate(lengths):
            rows = len(chunks[-1]) + 1
            slots = rows * (length + max_new_tokens)
            if chunks[-1] and (rows > self.max_batch_size
                               or (self.prefix_store is not None and slots > self.kv_cache_tokens)):
                chunks.append([])
            chunks[-1].append(i)
        return chunks

    def _share_prefixes(self, prompts: list[list[int]], depth: int = 3) -> None:
        """Prefill once, and store, the prefixes that several prompts of a batch share beyond
        what is already stored (a system prompt; a GRPO group's first observation), then the
        prefixes those share in turn, ``depth`` levels down."""
        import numpy as np

        from crl_harness.models.kv_cache import common_prefix

        assert self.prefix_store is not None
        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        stored = [self.prefix_store.lookup(a)[1] for a in arrays]
        shared = [0] * len(prompts)
        by_content = sorted(range(len(prompts)), key=lambda i: prompts[i])
        for a, b in zip(by_content, by_content[1:], strict=False):
            length = common_prefix(arrays[a], arrays[b])
            shared[a], shared[b] = max(shared[a], length), max(shared[b], length)
        inputs = {tuple(p) for p in prompts}
        jobs: dict[tuple[int, ...], list[int]] = {}
        for prompt, known, common in zip(prompts, stored, shared, strict=True):
            key = tuple(prompt[:common])
            if common >= known + self.MIN_SHARED_PREFIX and key not in inputs:
                jobs.setdefault(key, prompt[:common])
        if jobs and depth > 0:
            prefixes = sorted(jobs.values(), key=len)
            self._share_prefixes(prefixes, depth - 1)  # e.g. one system prompt, many groups
            decode_batch(self, prefixes, 0, 1.0, 1.0, None, shared=True)
