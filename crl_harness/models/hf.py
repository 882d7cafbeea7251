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
from pathlib import Path
from typing import Any

from crl_harness.models.base import (
    LENGTH,
    STOP,
    BackendUnavailableError,
    Generation,
    Message,
    ModelNotFoundError,
    encode_chat,
    stop_token_ids,
)

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
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    logps = torch.log_softmax(logits, dim=-1)
    tokens = torch.multinomial(logps.exp(), num_samples=1, generator=generator)[:, 0]
    return tokens, logps.gather(-1, tokens[:, None])[:, 0]


class HFBackend:
    """A transformers causal LM behind the ``ModelBackend`` protocol.

    ``model`` and ``tokenizer`` are public: the trainer computes differentiable log-probs with
    them and updates ``model`` in place (so ``load_weights`` is only needed for other weights).
    ``max_batch_size`` bounds how many conversations one forward pass holds; prompts are sorted
    by length so that padding stays small.

    Example:
        >>> from crl_harness.models.tiny import build_tiny_model
        >>> import tempfile
        >>> backend = HFBackend(build_tiny_model(tempfile.mkdtemp()))
        >>> [g] = backend.generate([[{"role": "user", "content": "hi"}]], max_new_tokens=4,
        ...                        temperature=1.0, seed=0)
        >>> len(g.token_ids) == len(g.logprobs) <= 4
        True
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: str = "auto",
        max_batch_size: int = 64,
        max_context: int | None = None,
    ) -> None:
        torch, transformers = _import_torch_transformers()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bfloat16" if device.startswith("cuda") else "float32"
        path = str(path)
        local = Path(path).expanduser()
        if local.suffix == ".gguf" and gguf_file is None:
            path, gguf_file = str(local.parent), local.name
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(path, **extra)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype), **extra
            )
        except OSError as err:
            raise ModelNotFoundError(
                f"Could not load a transformers model from {path!r}: {err}. Pass a local model "
                "directory, a .gguf file, a Hugging Face id reachable from this machine, or a "
                "short name such as 'smollm2-135m' (see crl_harness.models.registry)."
            ) from err
        self.model.to(device).eval()
        self.device = device
        self.name = f"hf:{path}" + (f"#{gguf_file}" if gguf_file else "")
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
    ) -> list[Generation]:
        return self.generate_from_ids(
            [encode_chat(self.tokenizer, messages) for messages in prompts],
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
        )

    def generate_from_ids(
        self,
        prompt_ids: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float = 1.0,
        seed: int | None = None,
    ) -> list[Generation]:
        """``generate`` for prompts that are already token ids."""
        import torch

        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, ()).item()))
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
        results: list[Generation | None] = [None] * len(prompt_ids)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            for index, generation in zip(
                chunk,
                self._decode([prompt_ids[i] for i in chunk], max_new_tokens, temperature, top_p,
                             generator),
                strict=True,
            ):
                results[index] = generation
        return results  # type: ignore[return-value]

    def load_weights(self, state_dict: dict[str, Any]) -> None:
        """Copy ``state_dict`` (e.g. the trainer's) into the model; every key must match."""
        self.model.load_state_dict(state_dict, strict=True)

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]

    # ----------------------------------------------------------------- decoding
    def _decode(self, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                top_p: float, generator: Any) -> list[Generation]:
        import torch
        from transformers import DynamicCache

        width = max(len(p) for p in prompts)
        if width + max_new_tokens > self.max_context:
            raise ValueError(
                f"A prompt of {width} tokens plus {max_new_tokens} new tokens exceeds the model's "
                f"context of {self.max_context}; shorten the history (history=k) or max_new_tokens."
            )
        # Left padding: every row's next token is written at the same position of the batch.
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids):] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finish = [LENGTH] * len(prompts)
        live = list(range(len(prompts)))  # batch row -> index into prompts
        cache = DynamicCache()
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            next_positions = positions[:, -1] + 1
            for step in range(max_new_tokens):
                chosen, chosen_logps = sample_next_token(out.logits[:, -1, :], temperature, top_p,
                                                         generator)
                keep = []
                for row, (token, logp) in enumerate(zip(chosen.tolist(), chosen_logps.tolist(),
                                                        strict=True)):
                    index = live[row]
                    tokens[index].append(token)
                    logprobs[index].append(logp)
                    if token in self.stop_ids:
                        finish[index] = STOP
                    else:
                        keep.append(row)
                if not keep or step == max_new_tokens - 1:
                    break
                if len(keep) < len(live):
                    rows = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(rows)
                    attention, chosen, next_positions = attention[rows], chosen[rows], next_positions[rows]
                    live = [live[row] for row in keep]
                attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=-1)
                out = self.model(input_ids=chosen[:, None], attention_mask=attention,
                                 position_ids=next_positions[:, None], past_key_values=cache,
                                 use_cache=True)
                next_positions = next_positions + 1
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
