"""``SharedPrefix``: the tokens every row of an update starts with, forward-passed once.

The rows of an update start with the same tokens (the chat header and the
env's instructions: a third of a cpu-demo row or more). ``SharedPrefix`` forward-passes them
once per update and every micro-batch continues from their keys and values; the gradient the
rows send into the prefix is gathered on detached copies and passed through the prefix's own
graph once, after the last micro-batch, so log-probs, loss and gradient are those of whole rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

__all__ = ["SharedPrefix", "attends_fully"]


def attends_fully(model: Any) -> bool:
    """Whether every layer of ``model`` attends to all earlier tokens: only then do the keys
    and values of a sequence's first tokens serve another sequence that starts with them (a
    sliding window's cache drops what falls out of the window)."""
    config = model.config.get_text_config(decoder=True)
    return all(kind == "full_attention" for kind in getattr(config, "layer_types", None) or [])


class _Row(Protocol):
    prompt_ids: list[int]


class SharedPrefix:
    """The tokens every row of an update starts with, forward-passed once (batch of one).

    ``cache(rows)`` gives a micro-batch the prefix's keys and values as a ``DynamicCache``,
    each layer's tensors expanded to the batch from detached leaves; the backward passes of the
    micro-batches sum their gradients into the leaves, and ``backward`` then passes those sums
    through the prefix's graph (the adapted layers' keys and values depend on the trained
    weights), once. A frozen layer's keys and values need no gradient and have none.
    ``MIN_TOKENS``: a shorter common prefix is not worth the extra forward call.
    """

    MIN_TOKENS = 16

    def __init__(self, model: Any, ids: list[int], device: torch.device) -> None:
        from transformers import DynamicCache

        self.length = len(ids)
        self.config = model.config
        out = model(input_ids=torch.tensor([ids], device=device),
                    past_key_values=DynamicCache(config=model.config), use_cache=True,
                    logits_to_keep=1)
        self.states = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        self.leaves = [tuple(t.detach().requires_grad_(t.requires_grad) for t in kv)
                       for kv in self.states]

    @staticmethod
    def of(rows: Sequence[_Row], model: Any) -> list[int] | None:
        """The token ids all ``rows`` start with, cut to leave each row at least one prompt
        token (the logit of its first completion token is read there); ``None`` when that is
        under ``MIN_TOKENS`` or the model has layers other than full attention (a sliding
        window's cache drops what falls out of the window)."""
        if not attends_fully(model):
            return None
        first = rows[0].prompt_ids
        length = min(len(r.prompt_ids) for r in rows) - 1
        for r in rows[1:]:
            same = 0
            while same < length and r.prompt_ids[same] == first[same]:
                same += 1
            length = same
        return list(first[:length]) if length >= SharedPrefix.MIN_TOKENS else None

    def cache(self, rows: int) -> Any:
        """A fresh cache holding the prefix for a micro-batch of ``rows`` rows."""
        from transformers import DynamicCache

        return DynamicCache([(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1))
                             for k, v in self.leaves], config=self.config)

    def backward(self) -> None:
        """Pass the gradient the micro-batches gathered on the leaves into the trained weights."""
        pairs = [(state, leaf.grad) for kv, leaves in zip(self.states, self.leaves, strict=True)
                 for state, leaf in zip(kv, leaves, strict=True) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([s for s, _ in pairs], [g for _, g in pairs])
