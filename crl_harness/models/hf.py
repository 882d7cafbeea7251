"""Hugging Face transformers backend (CPU or GPU; any model id, local path or GGUF file).

Holds ``HFBackend`` and ``sample_next_token``.

Decoding is a short loop over the model's forward pass with a KV cache instead of
``model.generate``, for three reasons that matter to RL: the log-prob of every sampled token is
taken under the exact distribution it was sampled from (temperature and top-p applied) without
keeping a vocabulary-sized score tensor per step; rows that have finished leave the batch at once
(rollout answers vary a lot in length); and the token ids are kept exactly as sampled.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from crl_harness.models.base import (
    LENGTH,
    STOP,
    BackendUnavailableError,
    Generation,
    Message,
    ModelLoadError,
    ModelNotFoundError,
    encode_chat,
    stop_token_ids,
)
from crl_harness.models.model_folder import adapter_base, check_model_folder, is_adapter_folder

__all__ = ["HFBackend", "sample_next_token"]


def _import_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as err:  # pragma: no cover - depends on the install
        raise BackendUnavailableError(
            "The hf backend needs torch and transformers: pip install 'crl-gym[train]'."
        ) from err
    return torch, transformers


def _resolve_device(torch: Any, device: str) -> str:
    """``auto``: CUDA where torch sees a device, else the CPU. A CUDA device asked for where none
    is gets one clear error here, instead of torch's from deep inside the first ``.to``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        why = ("this torch is a CPU-only build" if torch.version.cuda is None
               else f"this torch (CUDA {torch.version.cuda}) finds no usable GPU or driver")
        raise BackendUnavailableError(
            f"device={device!r} was asked for, but {why}. Install the CUDA build of torch (README, "
            "'On a GPU machine'), check nvidia-smi and CUDA_VISIBLE_DEVICES, or pass "
            "device='cpu' (or 'auto', which picks the CPU here).")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """The weights' dtype name: ``auto`` is bfloat16 on CUDA and float32 elsewhere.

    >>> resolve_dtype("auto", "cuda:0"), resolve_dtype("auto", "cpu"), resolve_dtype("float16", "cpu")
    ('bfloat16', 'float32', 'float16')
    """
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub (``$HF_ENDPOINT``, default huggingface.co) answers a TCP
    connection within ``timeout`` seconds; False under ``HF_HUB_OFFLINE=1``."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname or "huggingface.co",
                                       url.port or (80 if url.scheme == "http" else 443)),
                                      timeout=timeout):
            return True
    except OSError:
        return False


def cpu_computes_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX-BF16, from Linux's
    ``/proc/cpuinfo``), where a bf16 model runs about twice as fast as fp32; without them torch
    emulates bf16, slower than fp32. False where the flags cannot be read."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def sample_next_token(logits: Any, temperature: float, top_p: float, generator: Any = None):
    """Sample one token per row of ``logits`` and return ``(token_ids, logprobs)``.

    ``temperature <= 0`` is greedy decoding (log-probs then come from the untempered
    distribution). Otherwise logits are divided by the temperature, tokens outside the top-p
    nucleus are removed, and the log-prob is that of the renormalised distribution actually
    sampled from.

    Example:
        >>> import torch
        >>> tokens, logps = sample_next_token(torch.tensor([[0.0, 5.0, 1.0]]), 0.0, 1.0)
        >>> tokens.tolist(), round(float(logps.exp()), 3)
        ([1], 0.976)
    """
    import torch

    logits = logits.float()
    if temperature <= 0:
        logps = torch.log_softmax(logits, dim=-1)
        tokens = logps.argmax(dim=-1)
        return tokens, logps.gather(-1, tokens[:, None])[:, 0]
    logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p of the mass: the most
        # likely token always stays.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop_sorted[..., 0] = False  # top_p=0 too: the nucleus is never empty
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    logps = torch.log_softmax(logits, dim=-1)
    # Inverse-CDF sampling: one uniform number per row. torch.multinomial draws a random number
    # per vocabulary entry on a CPU (23 ms for 32 rows x 49k, a fifth of a decode step).
    cdf = logps.exp().cumsum(dim=-1)
    uniform = torch.rand((logits.shape[0], 1), generator=generator, device=logits.device)
    # side="right": the first token whose cumulative mass exceeds the draw, never one of mass 0
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True)[:, 0]
    tokens = tokens.clamp_(max=logits.shape[-1] - 1)
    return tokens, logps.gather(-1, tokens[:, None])[:, 0]


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
        kv_cache_tokens: int = 65_536,
        attn_implementation: str = "grouped_decode",
    ) -> None:
        torch, transformers = _import_torch_transformers()
        from crl_harness.models.allocator import keep_large_blocks_in_heap
        from crl_harness.models.attention import GROUPED_DECODE

        keep_large_blocks_in_heap()
        device = _resolve_device(torch, device)
        dtype = resolve_dtype(dtype, device)
        if attn_implementation == "grouped_decode":
            attn_implementation = GROUPED_DECODE
        path = str(path)
        local = Path(path).expanduser()
        if local.suffix == ".gguf" and gguf_file is None:
            path, gguf_file = str(local.parent), local.name
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        adapter = local if is_adapter_folder(local) else None
        if adapter is not None:  # LoRA adapters (e.g. a warm start): load their base, then merge
            from crl_harness.models.names import resolve_model_path

            path = resolve_model_path(adapter_base(adapter))
        if not gguf_file and Path(path).expanduser().is_dir():
            check_model_folder(Path(path).expanduser())
        elif not Path(path).expanduser().exists() and not hub_reachable():
            # a hub id on a machine without the hub: its cache only, at once (transformers would
            # retry the hub for about a minute before saying the same)
            extra["local_files_only"] = True
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, **extra)
            # An adapter is merged into an fp32 base and only then cast: merged in bf16, each
            # weight would be rounded after adding its update, which is not the trained function.
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32 if adapter is not None else getattr(torch, dtype),
                attn_implementation=attn_implementation, **extra
            )
            if adapter is not None:
                from peft import PeftModel

                self.model = PeftModel.from_pretrained(self.model, adapter).merge_and_unload()
                self.model.to(getattr(torch, dtype))
                # peft froze the base for inference; a merged model is a plain model again, which
                # the trainer may fine-tune in full
                self.model.requires_grad_(True)
        except OSError as err:
            reason = " ".join(str(err).split()).rstrip(".")  # one line
            raise ModelNotFoundError(
                f"Could not load a transformers model from {path!r}: {reason}. Pass a local model "
                "directory, a .gguf file, a Hugging Face id reachable from this machine, or a "
                "short name such as 'smollm2-135m' (see crl_harness.models.names)."
            ) from err
        except Exception as err:  # noqa: BLE001 - a damaged file fails in many library types
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            summary = " ".join(lines[:2])[:300].rstrip(".")
            raise ModelLoadError(
                f"Could not load {adapter or path}: {type(err).__name__}: {summary}. Its files "
                "are damaged or do not fit together (a truncated copy, adapters of another base "
                "model); write or copy it again."
            ) from err
        self.model.to(device).eval()
        self.device = device
        self.name = f"hf:{adapter or path}" + (f"#{gguf_file}" if gguf_file else "")
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
                f"context of {self.max_context}; shorten the history (history=k) or max_new_tokens."
            )
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, ()).item()))
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        results: list[Generation | None] = [None] * len(prompt_ids)
        with self._lock:
            self._drop_stale_prefixes()
            for chunk in self._chunks([len(prompt_ids[i]) for i in order], max_new_tokens):
                indices = [order[i] for i in chunk]
                prompts = [prompt_ids[i] for i in indices]
                if self.prefix_store is not None:
                    self._share_prefixes(prompts)
                generations = self._decode(prompts, max_new_tokens, temperature, top_p, generator,
                                           stop=tuple(stop))
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
            self._decode(prefixes, 0, 1.0, 1.0, None, shared=True)

    # ----------------------------------------------------------------- decoding
    @staticmethod
    def _prefill_runs(counts: list[int]) -> list[tuple[int, int]]:
        """Split ascending new-token ``counts`` into runs ``[first, end)`` prefilled together:
        a run grows while its longest row pads its shortest by at most a quarter (plus 16
        tokens), so padding stays small at the price of a forward pass per run.

        >>> HFBackend._prefill_runs([40, 42, 45, 120, 130, 350])
        [(0, 3), (3, 5), (5, 6)]
        """
        runs: list[tuple[int, int]] = []
        first = 0
        for i, count in enumerate(counts):
            if count > 1.25 * counts[first] + 16:
                runs.append((first, i))
                first = i
        runs.append((first, len(counts)))
        return runs

    def _ends_with_stop(self, tokens: list[int], stop: tuple[str, ...]) -> bool:
        """Whether the answer's text now contains a stop string. Only the tail is decoded: a stop
        string first appears with the latest token, within its length in tokens (each token
        writes at least one character; the margin covers tokens that write none)."""
        window = max(len(s) for s in stop) + 8
        tail = self.tokenizer.decode(tokens[-window:], skip_special_tokens=True)
        return any(s in tail for s in stop)

    def _decode(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                top_p: float, generator: Any, shared: bool = False,
                stop: tuple[str, ...] = ()) -> list[Generation]:
        """Prefill what is not stored yet, then sample up to ``max_new_tokens`` per prompt.

        The batch cache is one slab: row r holds its reused prefix right-aligned in columns
        ``[C - reuse_r, C)``, its new prompt tokens right-aligned in ``[C, C + S)``, then its
        answer; the attention mask hides the unused columns between them. Rows are ordered by
        how many new tokens they bring and prefilled in runs of similar counts (``_prefill_runs``),
        so that one long newcomer does not pad every row to its length. ``max_new_tokens=0``
        only prefills and stores (shared prefixes).
        """
        import torch

        from crl_harness.models.kv_cache import SlabCache

        store, layout = self.prefix_store, self.kv_layout
        found = [store.lookup(p) if store is not None else (None, 0) for p in prompts]
        reuse = [min(n, len(p) - 1) for (_, n), p in zip(found, prompts, strict=True)]
        new = [len(p) - n for p, n in zip(prompts, reuse, strict=True)]
        by_new = sorted(range(len(prompts)), key=lambda i: new[i])  # batch row -> prompt index
        C, S, B = max(reuse), max(new), len(prompts)
        slab = torch.empty((layout.layers, 2, B, layout.kv_heads, C + S + max(max_new_tokens - 1, 0),
                            layout.head_dim), dtype=self.model.dtype, device=self.device)
        input_ids = torch.full((B, S), self.pad_id, dtype=torch.long)
        attention = torch.zeros((B, C + S), dtype=torch.long)
        positions = torch.zeros((B, S), dtype=torch.long)
        prefix_columns: dict[int, torch.Tensor] = {}
        for row, index in enumerate(by_new):
            prompt, entry, n, s = prompts[index], found[index][0], reuse[index], new[index]
            # Masked columns must hold finite numbers: a masked key gets weight 0, and 0 * NaN
            # from uninitialised memory would still be NaN.
            slab[:, :, row, :, : C - n] = 0
            if n:
                slab[:, :, row, :, C - n : C] = entry.kv[:, :, :, :n]
            input_ids[row, S - s :] = torch.tensor(prompt[n:], dtype=torch.long)
            positions[row, S - s :] = torch.arange(n, len(prompt))
            attention[row, C - n : C] = 1
            attention[row, C + S - s :] = 1
            prefix_columns[index] = torch.cat([torch.arange(C - n, C),
                                               torch.arange(C + S - s, C + S)])
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = positions.to(self.device)
        self.cache_stats["prefilled_tokens"] += sum(new)
        self.cache_stats["reused_tokens"] += sum(reuse)

        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finish = [LENGTH] * len(prompts)
        live = list(by_new)  # batch row -> index into prompts

        def store_row(row: int, index: int) -> None:
            # What was fed through the model: the prompt and every sampled token but the last.
            if store is None:
                return
            fed = max(len(tokens[index]) - 1, 0)
            columns = torch.cat([prefix_columns[index], torch.arange(C + S, C + S + fed)])
            store.add(prompts[index] + tokens[index][:fed],
                      cache.row_kv(row, columns.to(self.device)),
                      shared=shared, replaces=found[index][0])

        with torch.inference_mode():
            last_logits = []
            for first, end in self._prefill_runs([new[i] for i in by_new]):
                width = new[by_new[end - 1]]  # the run's longest: its tokens start at C + S - width
                slab[:, :, first:end, :, C : C + S - width] = 0  # columns no row of the run uses
                out = self.model(input_ids=input_ids[first:end, S - width:],
                                 attention_mask=attention[first:end],
                                 position_ids=positions[first:end, S - width:],
                                 past_key_values=SlabCache(slab[:, :, first:end], C + S - width),
                                 use_cache=True, logits_to_keep=1)
                last_logits.append(out.logits[:, -1, :])
            logits = torch.cat(last_logits)
            cache = SlabCache(slab, C + S)
            next_positions = torch.tensor([len(prompts[i]) for i in live], device=self.device)
            for step in range(max_new_tokens):
                chosen, chosen_logps = sample_next_token(logits, temperature, top_p, generator)
                keep = []
                for row, (token, logp) in enumerate(zip(chosen.tolist(), chosen_logps.tolist(),
                                                        strict=True)):
                    index = live[row]
                    tokens[index].append(token)
                    logprobs[index].append(logp)
                    if token in self.stop_ids or (stop and self._ends_with_stop(tokens[index], stop)):
                        finish[index] = STOP
                    else:
                        keep.append(row)
                if not keep or step == max_new_tokens - 1:
                    break
                if len(keep) < len(live):
                    for row in sorted(set(range(len(live))) - set(keep)):
                        store_row(row, live[row])
                    order = cache.keep_rows(keep)
                    rows = torch.tensor(order, device=self.device)
                    attention, chosen, next_positions = attention[rows], chosen[rows], next_positions[rows]
                    live = [live[row] for row in order]
                attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=-1)
                out = self.model(input_ids=chosen[:, None], attention_mask=attention,
                                 position_ids=next_positions[:, None], past_key_values=cache,
                                 use_cache=True)
                logits = out.logits[:, -1, :]
                next_positions = next_positions + 1
            for row, index in enumerate(live):
                store_row(row, index)
        if max_new_tokens == 0:
            return []
        return [
            Generation(
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                prompt_token_ids=list(prompt),
                token_ids=ids,
                logprobs=lps,
                finish_reason=reason,
            )
            for prompt, ids, lps, reason in zip(prompts, tokens, logprobs, finish, strict=True)
        ]
