"""``PolicyLearner``: one optimiser update of a causal LM from sampled completions and a loss.

Holds ``TrainingRow`` (one prompt + its generated tokens, their sampling log-probs, the
advantage and the token weight of "sequence-mean then batch-mean"), ``PolicyLearner`` and
``apply_lora``.

The log-probs are recomputed under the same temperature the tokens were sampled with, so the
importance ratio starts at 1 for on-policy data (top-p truncation is not re-applied: with
top_p < 1 the ratio is against the untruncated tempered distribution).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from crl_harness.config import LoRAConfig
from crl_harness.losses import LossTerms

__all__ = ["TrainingRow", "UpdateStats", "PolicyLearner", "apply_lora"]

LossFn = Callable[..., LossTerms]


@dataclass
class TrainingRow:
    """One forward row: a prompt, the tokens the model generated after it, and their credit."""

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    token_weight: float


@dataclass
class UpdateStats:
    """What one update did, for the metrics."""

    loss: float
    clip_fraction: float
    grad_norm: float
    tokens: int
    rows: int


def apply_lora(model: Any, lora: LoRAConfig) -> Any:
    """Inject LoRA adapters (peft) into ``model`` in place; only they stay trainable."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, config)


class PolicyLearner:
    """Trains ``model`` in place: AdamW, gradient accumulation over micro-batches, norm clipping.

    The model object is shared with the generating backend when both live in one process, so
    an update is visible to the next rollout at once; ``trainable_state_dict`` gives what a
    remote copy needs (the adapters only, with LoRA).
    """

    def __init__(self, model: Any, *, lr: float, max_grad_norm: float, temperature: float,
                 micro_batch_size: int, lora: LoRAConfig | None = None) -> None:
        self.base_model = model
        self.model = apply_lora(model, lora) if lora is not None and lora.enabled else model
        self.lora = lora if lora is not None and lora.enabled else None
        self.max_grad_norm = max_grad_norm
        self.temperature = temperature if temperature > 0 else 1.0
        self.micro_batch_size = micro_batch_size
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.parameters, lr=lr, weight_decay=0.0)
        self.device = next(self.model.parameters()).device

    # ------------------------------------------------------------------ log-probs
    def token_logprobs(self, rows: Sequence[TrainingRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """Differentiable log-probs of each row's completion tokens, right-aligned: (rows, K)
        with K the longest completion, and the mask of real tokens."""
        width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
        K = max(len(r.completion_ids) for r in rows)
        # Left padding puts every completion at the end, so only the last K+1 logits are needed.
        pad = 0
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), K), dtype=torch.float32)
        for i, r in enumerate(rows):
            ids = r.prompt_ids + r.completion_ids
            input_ids[i, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[i, width - len(ids):] = 1
            mask[i, K - len(r.completion_ids):] = 1.0
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                         use_cache=False, logits_to_keep=K + 1)
        logits = out.logits[:, :-1, :].float() / self.temperature
        targets = input_ids[:, width - K:]
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
        return logprobs, mask.to(self.device)

    # ------------------------------------------------------------------ update
    def update(self, rows: Sequence[TrainingRow], loss_fn: LossFn) -> UpdateStats:
        """One optimiser step over all ``rows`` (one epoch), the loss summed over micro-batches.

        ``loss_fn(logprobs, old_logprobs, advantages, mask, token_weight=...)`` is a loss of
        ``crl_harness.losses`` with its hyperparameters bound.
        """
        rows = [r for r in rows if r.completion_ids]
        if not rows:
            return UpdateStats(0.0, 0.0, 0.0, 0, 0)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        order = sorted(rows, key=lambda r: len(r.prompt_ids) + len(r.completion_ids))
        total_loss, clipped, tokens = 0.0, 0, 0
        try:
            for start in range(0, len(order), self.micro_batch_size):
                batch = order[start : start + self.micro_batch_size]
                logprobs, mask = self.token_logprobs(batch)
                K = logprobs.shape[1]
                old = torch.zeros_like(logprobs)
                for i, r in enumerate(batch):
                    old[i, K - len(r.old_logprobs):] = torch.tensor(r.old_logprobs)
                terms = loss_fn(
                    logprobs, old,
                    torch.tensor([r.advantage for r in batch], device=self.device),
                    mask,
                    token_weight=torch.tensor([r.token_weight for r in batch], device=self.device),
                )
                terms.loss.backward()
                total_loss += float(terms.loss.detach())
                clipped += terms.clipped_tokens
                tokens += terms.tokens
            grad_norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
            self.optimizer.step()
        finally:
            self.optimizer.zero_grad(set_to_none=True)
            self.model.eval()
        return UpdateStats(total_loss, clipped / max(tokens, 1), float(grad_norm), tokens, len(rows))

    # ------------------------------------------------------------------ weights
    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """What changes in training: the whole model's weights, or only the LoRA adapters."""
        if self.lora is not None:
            from peft import get_peft_model_state_dict

            return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        return {k: v.detach().cpu().clone() for k, v in self.base_model.state_dict().items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if self.lora is not None:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state)
        else:
            self.base_model.load_state_dict(state, strict=True)
