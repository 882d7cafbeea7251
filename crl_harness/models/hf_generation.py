"""The HF backend's batched generation loop: prefill, decode steps, sampling.

Holds:
- ``sample_next_token``: one token per row of logits under temperature and top-p, with the
  log-prob of the distribution it was sampled from.
- ``row_generators``: one random generator per prompt of a seeded batch, so that a row's draws
  depend on the seed and its place in the batch only, never on which rows the KV cache
  prefilled together, how the batch was split, or when the other rows finished.
- ``decode_batch``: one batch of an ``HFBackend``: prefill what its prefix store lacks, in runs of
  similar lengths (``prefill_runs``), into one slab cache, then sample step by step, moving
  finished rows out of the batch (``ends_with_stop``: a stop string met) and storing their keys
  and values.

Decoding is a short loop over the model's forward pass with a KV cache instead of
``model.generate``, for three reasons that matter to RL: the log-prob of every sampled token is
taken under the exact distribution it was sampled from (temperature and top-p applied) without
keeping a vocabulary-sized score tensor per step; rows that have finished leave the batch at once
(rollout answers vary a lot in length); and the token ids are kept exactly as sampled.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from crl_harness.models.base import LENGTH, STOP, Generation

__all__ = ["decode_batch", "ends_with_stop", "prefill_runs", "row_generators",
           "sample_next_token"]


def row_generators(seed: int, rows: int) -> list[Any]:
    """One CPU ``torch.Generator`` per row, each seeded from ``seed`` and the row's index mixed
    by a hash (``seed + index`` would give turn t + 1's row 0 turn t's row 1's draws: the
    engine seeds consecutive turns with consecutive seeds). On the CPU whatever the device: a
    draw per row and step is one number, and the draws are then the same on every device.

    >>> import torch
    >>> a, b = row_generators(7, 2), row_generators(7, 3)
    >>> [float(torch.rand(1, generator=g)) for g in a] == [float(torch.rand(1, generator=g))
    ...                                                     for g in b[:2]]
    True
    """
    import torch

    generators = []
    for index in range(rows):
        digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
        generators.append(torch.Generator().manual_seed(int.from_bytes(digest, "little")))
    return generators


def sample_next_token(logits: Any, temperature: float, top_p: float,
                      generators: Sequence[Any] | None = None):
    """Sample one token per row of ``logits`` and return ``(token_ids, logprobs)``.

    ``temperature <= 0`` is greedy decoding (log-probs then come from the untempered
    distribution). Otherwise logits are divided by the temperature, tokens outside the top-p
    nucleus are removed, and the log-prob is that of the renormalised distribution actually
    sampled from. ``generators``: one per row (``row_generators``), each drawing that row's one
    uniform number; None: torch's global generator.

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
    if generators is None:
        uniform = torch.rand((logits.shape[0], 1), device=logits.device)
    else:
        uniform = torch.cat([torch.rand(1, generator=g, device="cpu") for g in generators])
        uniform = uniform[:, None].to(logits.device)  # drawn on the host: the same everywhere
    # side="right": the first token whose cumulative mass exceeds the draw, never one of mass 0
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True)[:, 0]
    tokens = tokens.clamp_(max=logits.shape[-1] - 1)
    return tokens, logps.gather(-1, tokens[:, None])[:, 0]


def prefill_runs(counts: list[int]) -> list[tuple[int, int]]:
    """Split ascending new-token ``counts`` into runs ``[first, end)`` prefilled together:
    a run grows while its longest row pads its shortest by at most a quarter (plus 16
    tokens), so padding stays small at the price of a forward pass per run.

    >>> prefill_runs([40, 42, 45, 120, 130, 350])
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


def ends_with_stop(tokenizer: Any, tokens: list[int], stop: tuple[str, ...]) -> bool:
    """Whether the answer's text now contains a stop string. Only the tail is decoded: a stop
    string first appears with the latest token, within its length in tokens (each token
    writes at least one character; the margin covers tokens that write none)."""
    window = max(len(s) for s in stop) + 8
    tail = tokenizer.decode(tokens[-window:], skip_special_tokens=True)
    return any(s in tail for s in stop)


def decode_batch(backend: Any, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                 top_p: float, generators: Sequence[Any] | None, shared: bool = False,
                 stop: tuple[str, ...] = ()) -> list[Generation]:
    """Prefill what is not stored yet, then sample up to ``max_new_tokens`` per prompt.

    ``backend`` is the ``HFBackend`` whose batch this is: its ``model``, ``tokenizer``, ``device``,
    ``pad_id``, ``stop_ids``, ``prefix_store`` (``None`` without KV reuse), ``kv_layout`` and
    ``cache_stats`` (counts added to) are used.

    The batch cache is one slab: row r holds its reused prefix right-aligned in columns
    ``[C - reuse_r, C)``, its new prompt tokens right-aligned in ``[C, C + S)``, then its
    answer; the attention mask hides the unused columns between them. Rows are ordered by
    how many new tokens they bring and prefilled in runs of similar counts (``prefill_runs``),
    so that one long newcomer does not pad every row to its length. ``max_new_tokens=0``
    only prefills and stores (shared prefixes). ``generators``: one per prompt, in the order of
    ``prompts`` (each row samples from its own, whatever its place in the slab).
    """
    import torch

    from crl_harness.models.kv_cache import SlabCache

    store, layout = backend.prefix_store, backend.kv_layout
    found = [store.lookup(p) if store is not None else (None, 0) for p in prompts]
    reuse = [min(n, len(p) - 1) for (_, n), p in zip(found, prompts, strict=True)]
    new = [len(p) - n for p, n in zip(prompts, reuse, strict=True)]
    by_new = sorted(range(len(prompts)), key=lambda i: new[i])  # batch row -> prompt index
    C, S, B = max(reuse), max(new), len(prompts)
    slab = torch.empty((layout.layers, 2, B, layout.kv_heads, C + S + max(max_new_tokens - 1, 0),
                        layout.head_dim), dtype=backend.model.dtype, device=backend.device)
    slab[:, :, :, :, C + S :] = 0  # the decode columns: read (masked) before they are written
    input_ids = torch.full((B, S), backend.pad_id, dtype=torch.long)
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
    input_ids, attention = input_ids.to(backend.device), attention.to(backend.device)
    positions = positions.to(backend.device)
    backend.cache_stats["prefilled_tokens"] += sum(new)
    backend.cache_stats["reused_tokens"] += sum(reuse)

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
                  cache.row_kv(row, columns.to(backend.device)),
                  shared=shared, replaces=found[index][0])

    with torch.inference_mode():
        last_logits = []
        for first, end in prefill_runs([new[i] for i in by_new]):
            width = new[by_new[end - 1]]  # the run's longest: its tokens start at C + S - width
            slab[:, :, first:end, :, C : C + S - width] = 0  # columns no row of the run uses
            out = backend.model(input_ids=input_ids[first:end, S - width:],
                                attention_mask=attention[first:end],
                                position_ids=positions[first:end, S - width:],
                                past_key_values=SlabCache(slab[:, :, first:end], C + S - width),
                                use_cache=True, logits_to_keep=1)
            last_logits.append(out.logits[:, -1, :])
        logits = torch.cat(last_logits)
        cache = SlabCache(slab, C + S)
        next_positions = torch.tensor([len(prompts[i]) for i in live], device=backend.device)
        for step in range(max_new_tokens):
            chosen, chosen_logps = sample_next_token(
                logits, temperature, top_p,
                None if generators is None else [generators[index] for index in live])
            keep = []
            for row, (token, logp) in enumerate(zip(chosen.tolist(), chosen_logps.tolist(),
                                                    strict=True)):
                index = live[row]
                tokens[index].append(token)
                logprobs[index].append(logp)
                if token in backend.stop_ids or (
                        stop and ends_with_stop(backend.tokenizer, tokens[index], stop)):
                    finish[index] = STOP
                else:
                    keep.append(row)
            if not keep or step == max_new_tokens - 1:
                break
            if len(keep) < len(live):
                for row in sorted(set(range(len(live))) - set(keep)):
                    store_row(row, live[row])
                order = cache.keep_rows(keep)
                rows = torch.tensor(order, device=backend.device)
                attention, chosen, next_positions = attention[rows], chosen[rows], next_positions[rows]
                live = [live[row] for row in order]
            attention = torch.cat([attention, attention.new_ones((len(live), 1))], dim=-1)
            out = backend.model(input_ids=chosen[:, None], attention_mask=attention,
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
            text=backend.tokenizer.decode(ids, skip_special_tokens=True),
            prompt_token_ids=list(prompt),
            token_ids=ids,
            logprobs=lps,
            finish_reason=reason,
        )
        for prompt, ids, lps, reason in zip(prompts, tokens, logprobs, finish, strict=True)
    ]
