"""``PolicyLearner``: one optimiser update of a causal LM from sampled completions and a loss.

Holds ``TrainingRow`` (one prompt + its generated tokens, their sampling log-probs, the
advantage and the token weight of "sequence-mean then batch-mean"; a packed episode's row
masks its observations out with ``completion_mask``), ``PolicyLearner`` and ``apply_lora``.

The log-probs are recomputed under the same temperature the tokens were sampled with, so the
importance ratio starts at 1 for on-policy data (top-p truncation is not re-applied: with
top_p < 1 the ratio is against the untruncated tempered distribution).

Precision: the model keeps the dtype it was loaded in, which is what the rollouts run with
(bfloat16 on a GPU). Every trainable parameter that is not fp32 gets an fp32 master copy; AdamW
and the norm clip work on the masters, and after each step the model's parameter is its master
rounded to the model's dtype. An update of 1e-6 (the released lr) is far below bf16's resolution
(2^-8 relative), so without masters most of it would be rounded away every step; with them it
accumulates until it shows. fp32 parameters (an fp32 model, LoRA adapters) are their own masters.
float16 adds dynamic loss scaling, without which its gradients underflow.

Shared tokens: the rows' common prompt prefix is forward-passed once an update
(``crl_harness.training.shared_prefix``); within a micro-batch, rows in token order continue from
the row before them where their tokens agree (``token_logprobs``).

Old log-probs: ``recompute_old_logprobs`` takes the ratio's old log-probs from the learner
instead of the sampler (on by default unless the model runs in fp32: in bf16 the sampler's
cached step-by-step decoding and the learner's full forward pass differ; SmolLM2-135M on a CPU
showed on-policy ratios of 0.80-1.22). The sampler's log-probs stay in the rows and their gap
to the learner's is reported.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from crl_harness.config import LoRAConfig
from crl_harness.training.losses import LossTerms
from crl_harness.training.shared_prefix import SharedPrefix, attends_fully

__all__ = ["TrainingRow", "UpdateStats", "PolicyLearner", "SharedPrefix", "apply_lora",
           "load_trainable_state"]

LossFn = Callable[..., LossTerms]


@dataclass
class TrainingRow:
    """One forward row: a prompt, the tokens the model generated after it, and their credit.

    ``completion_mask`` (a packed episode, ``crl_harness.training.packing``): one flag per
    completion token, 1 = trained, 0 = context only (an observation between two replies);
    ``old_logprobs`` still has one value per completion token (any value where the mask is 0).
    ``None``: every completion token is trained.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    token_weight: float
    completion_mask: list[int] | None = None

    def __post_init__(self) -> None:
        if self.completion_mask is not None and not (
                len(self.completion_mask) == len(self.old_logprobs) == len(self.completion_ids)):
            raise ValueError(
                f"a masked row needs one mask flag and one old log-prob per completion token: "
                f"{len(self.completion_ids)} tokens, {len(self.completion_mask)} flags, "
                f"{len(self.old_logprobs)} log-probs")

    @property
    def trained_tokens(self) -> int:
        """How many completion tokens the loss sees."""
        if self.completion_mask is None:
            return len(self.completion_ids)
        return sum(1 for flag in self.completion_mask if flag)


@dataclass
class UpdateStats:
    """What one update did, for the metrics.

    ``logprob_gap_mean`` / ``logprob_gap_max``: mean and largest |learner - sampler| log-prob
    over the trained tokens, measured before the step (the sampler/learner mismatch).
    """

    loss: float
    clip_fraction: float
    grad_norm: float
    tokens: int
    rows: int
    logprob_gap_mean: float = 0.0
    logprob_gap_max: float = 0.0


def apply_lora(model: Any, lora: LoRAConfig) -> Any:
    """Inject LoRA adapters (peft) into ``model`` in place; only they stay trainable, in fp32
    whatever the model's dtype. ``lora.init_from``: the adapters of that folder, unmerged and
    trainable (their own shape), else fresh ones of ``lora``'s shape."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if lora.init_from is not None:
        from crl_harness.models.names import resolve_model_path

        peft_model = PeftModel.from_pretrained(model, resolve_model_path(lora.init_from),
                                               is_trainable=True)
        return _adapters_in_fp32(peft_model)
    layers = None
    if lora.top_layers:
        total = model.config.num_hidden_layers
        if lora.top_layers > total:
            raise ValueError(f"lora.top_layers={lora.top_layers} but the model has {total} layers")
        layers = list(range(total - lora.top_layers, total))
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), task_type="CAUSAL_LM",
                        layers_to_transform=layers)
    return _adapters_in_fp32(get_peft_model(model, config))


def load_trainable_state(model: Any, state: dict[str, torch.Tensor], *, lora: bool) -> None:
    """``state`` (a learner's ``trainable_state_dict``) into ``model``: its LoRA adapters (peft's
    names) with ``lora``, else every weight, each key matching."""
    if lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state)
    else:
        model.load_state_dict(state, strict=True)


def _adapters_in_fp32(peft_model: Any) -> Any:
    """The trainable adapters in fp32 (peft already upcasts those of a bf16/fp16 base; this
    makes it a guarantee): they are their own AdamW masters, and a small update is not
    rounded away as it would be in bf16."""
    with torch.no_grad():
        for parameter in peft_model.parameters():
            if parameter.requires_grad and parameter.dtype != torch.float32:
                parameter.data = parameter.data.float()
    return peft_model


def _final_logits(config: Any, logits: torch.Tensor) -> torch.Tensor:
    """What the model's own forward does to its head's output, for the families that scale it
    (Gemma 2/3 soft-cap, Cohere's scale, Granite's divisor); the identity for the rest."""
    config = config.get_text_config(decoder=True)
    if getattr(config, "logit_scale", None) is not None:
        logits = logits * config.logit_scale
    if getattr(config, "logits_scaling", None) is not None:
        logits = logits / config.logits_scaling
    cap = getattr(config, "final_logit_softcapping", None)
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    return logits


class PolicyLearner:
    """Trains ``model`` in place: AdamW on fp32 masters, gradient accumulation over
    micro-batches, norm clipping (see the module docstring for precision and old log-probs).

    The model object is shared with the generating backend when both live in one process, so
    an update is visible to the next rollout at once; ``trainable_state_dict`` gives what a
    remote copy or a checkpoint needs (fp32 masters; the adapters only, with LoRA).
    ``recompute_old_logprobs=None`` turns recomputation on unless the model runs in fp32.
    ``share_prefix``: forward the rows' common first tokens once an update (``SharedPrefix``)
    and a micro-batch's neighbouring rows' common first tokens once (``token_logprobs``); off
    gives the same numbers at the cost of the full rows (``benchmarks/actor_update_bench.py``).
    """

    def __init__(self, model: Any, *, lr: float, max_grad_norm: float, temperature: float,
                 micro_batch_size: int, lora: LoRAConfig | None = None,
                 recompute_old_logprobs: bool | None = None, share_prefix: bool = True) -> None:
        self.base_model = model
        self.model = apply_lora(model, lora) if lora is not None and lora.enabled else model
        self.lora = lora if lora is not None and lora.enabled else None
        self.max_grad_norm = max_grad_norm
        self.temperature = temperature if temperature > 0 else 1.0
        self.micro_batch_size = micro_batch_size
        self.share_prefix = share_prefix
        self.dtype: torch.dtype = getattr(model, "dtype", None) or next(model.parameters()).dtype
        self.recompute_old_logprobs = (self.dtype != torch.float32
                                       if recompute_old_logprobs is None
                                       else recompute_old_logprobs)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.masters = [p if p.dtype == torch.float32 else p.detach().float()
                        for p in self.parameters]
        # (model parameter, its separate fp32 master): the pairs that need copying
        self._copies = [(p, m) for p, m in zip(self.parameters, self.masters, strict=True)
                        if m is not p]
        self.optimizer = torch.optim.AdamW(self.masters, lr=lr, weight_decay=0.0)
        self.device = next(self.model.parameters()).device
        # the decoder and the vocabulary head apart, so that logits are computed only where a
        # row trains (``token_logprobs``); peft injects its adapters into these very modules
        self._decoder = self.base_model.get_decoder()
        self._head = self.base_model.get_output_embeddings()
        self.scaler = torch.amp.GradScaler(self.device.type) \
            if self.dtype == torch.float16 else None

    # ------------------------------------------------------------------ log-probs
    def token_logprobs(self, rows: Sequence[TrainingRow], prefix: SharedPrefix | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Differentiable log-probs of each row's completion tokens, right-aligned: (rows, K)
        with K the longest completion, and the mask of the trained tokens (a row's
        ``completion_mask``, else all its completion tokens). Where the mask is 0 the log-prob is
        0: losses and metrics must read it through the mask.
        ``prefix``: the rows' first ``prefix.length`` tokens, already forward-passed.

        One row at a time, no padding; with ``share_prefix`` a row continues from the keys and
        values of the row before it for the tokens the two have in common (``update`` orders
        the rows so that neighbours share the most: a group's episodes of one level often play
        the same first replies), and the gradient flows back through that shared part.
        """
        from transformers import DynamicCache

        start = prefix.length if prefix is not None else 0
        K = max(len(r.completion_ids) for r in rows)
        mask = torch.zeros((len(rows), K), dtype=torch.float32)
        gathered, targets = [], []
        before: list[int] = []  # the previous row's ids, whose keys and values are ``cache``
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden_before: torch.Tensor | None = None  # its hidden states from ``start`` on
        share = self.share_prefix and attends_fully(self.base_model)
        for i, r in enumerate(rows):
            ids = r.prompt_ids + r.completion_ids
            flags = r.completion_mask if r.completion_mask is not None \
                else [1] * len(r.completion_ids)
            mask[i, K - len(flags):] = torch.as_tensor(flags, dtype=torch.float32)
            common = len(os.path.commonprefix([before, ids])) if share and before else 0
            common = min(common, len(ids) - 1)  # the row computes at least its last token
            if common <= start:
                common = start
                context = list(prefix.leaves) if prefix is not None else []
                kept = None
            else:
                context = [(k[:, :, :common], v[:, :, :common]) for k, v in cache]
                kept = hidden_before[:, :common - start]
            # a cache only where keys and values are continued or kept for the next row (both
            # only where every layer attends fully, so its layers are plain full ones)
            rest = {"past_key_values": DynamicCache(context or None), "use_cache": True} \
                if context or share else {"use_cache": False}
            out = self._decoder(input_ids=torch.tensor([ids[common:]], device=self.device),
                                **rest)
            own = out.last_hidden_state
            hidden = own if kept is None else torch.cat([kept, own], dim=1)
            # the logit before each trained token, in this row's hidden states from ``start``
            at = [len(r.prompt_ids) + j - 1 - start for j, flag in enumerate(flags) if flag]
            gathered.append(hidden[0, at])
            targets.extend(ids[a + 1 + start] for a in at)
            before, hidden_before = ids, hidden
            if share:
                cache = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        logits = _final_logits(self.base_model.config, self._head(torch.cat(gathered)).float())
        logits = logits / self.temperature
        target = torch.tensor(targets, dtype=torch.long).to(self.device)
        kept_logprobs = logits.gather(-1, target[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
        rows_at, columns = mask.nonzero(as_tuple=True)  # row-major: each row's tokens in order
        logprobs = kept_logprobs.new_zeros((len(rows), K)).index_put(
            (rows_at.to(self.device), columns.to(self.device)), kept_logprobs)
        return logprobs, mask.to(self.device)

    # ------------------------------------------------------------------ update
    def update(self, rows: Sequence[TrainingRow], loss_fn: LossFn) -> UpdateStats:
        """One optimiser step over all ``rows`` (one epoch), the loss summed over micro-batches.

        ``loss_fn(logprobs, old_logprobs, advantages, mask, token_weight=...)`` is a loss of
        ``crl_harness.training.losses`` with its hyperparameters bound.
        """
        rows = [r for r in rows if r.trained_tokens]
        if not rows:
            return UpdateStats(0.0, 0.0, 0.0, 0, 0)
        self.model.train()
        self._zero_grad()
        # In token order: neighbours share their longest common first tokens
        # (``token_logprobs`` forward-passes those once within a micro-batch).
        order = sorted(rows, key=lambda r: r.prompt_ids + r.completion_ids)
        total_loss, clipped, tokens, gap_sum, gap_max = 0.0, 0, 0, 0.0, 0.0
        try:
            shared = SharedPrefix.of(order, self.model) \
                if self.share_prefix and len(order) > 1 else None
            prefix = SharedPrefix(self.model, shared, self.device) if shared else None
            for start in range(0, len(order), self.micro_batch_size):
                batch = order[start : start + self.micro_batch_size]
                logprobs, mask = self.token_logprobs(batch, prefix)
                K = logprobs.shape[1]
                # Right-aligned like the log-probs, built in one host-to-device copy.
                sampler = torch.tensor([[0.0] * (K - len(r.old_logprobs)) + list(r.old_logprobs)
                                        for r in batch], dtype=logprobs.dtype, device=self.device)
                # Untrained positions get the learner's own values: ratio 1 and gap 0 there, so
                # whatever a row put in them (0.0 for a packed row's observations) never reaches
                # the loss as an inf or a NaN.
                sampler = torch.where(mask > 0, sampler, logprobs.detach())
                # One optimiser step per update, after every micro-batch: until then the weights
                # are the old policy's, so its recomputed log-probs are this very pass's,
                # detached (no second forward). Several steps per update would need that pass.
                old = logprobs.detach() if self.recompute_old_logprobs else sampler
                gap = (logprobs.detach() - sampler).abs() * mask
                gap_sum += float(gap.sum())
                gap_max = max(gap_max, float(gap.max()))
                terms = loss_fn(
                    logprobs, old,
                    torch.tensor([r.advantage for r in batch], device=self.device),
                    mask,
                    token_weight=torch.tensor([r.token_weight for r in batch], device=self.device),
                )
                (terms.loss if self.scaler is None else self.scaler.scale(terms.loss)).backward()
                total_loss += float(terms.loss.detach())
                clipped += terms.clipped_tokens
                tokens += terms.tokens
            if prefix is not None:
                prefix.backward()
            grad_norm = self._step()
        finally:
            self._zero_grad()
            self.model.eval()
        return UpdateStats(total_loss, clipped / max(tokens, 1), grad_norm, tokens, len(rows),
                           gap_sum / max(tokens, 1), gap_max)

    def _step(self) -> float:
        """Gradients to the fp32 masters, unscale (fp16), clip, AdamW, masters to the model."""
        for p, m in self._copies:
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None  # the low-precision copy is not needed any more: free it now
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.masters, self.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped when a gradient overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        with torch.no_grad():  # in place, under no_grad: bumps the version the KV reuse checks
            for p, m in self._copies:
                p.copy_(m)
        return float(grad_norm)

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p, _ in self._copies:
            p.grad = None

    # ------------------------------------------------------------------ weights
    def _live_state(self) -> dict[str, torch.Tensor]:
        """The trainable state's tensors as they live in the model (sharing its storage)."""
        if self.lora is not None:
            from peft import get_peft_model_state_dict

            # no hub lookup of the base's vocabulary (never resized here): no network, no warning
            return get_peft_model_state_dict(self.model, save_embedding_layers=False)
        return self.base_model.state_dict()

    def _masters_by_storage(self) -> dict[int, torch.Tensor]:
        return {p.data_ptr(): m for p, m in self._copies}

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's weights as a plain transformers state dict in fp32, what a separate
        sampler (a vLLM engine) or an export needs: fp32 masters where the model holds a rounded
        copy, and with LoRA each adapted weight as base + delta added in fp32 (merged in bf16,
        each weight would be rounded after its update; the model itself is left untouched, as
        merging in place and back would round its base weights). Tensors may share storage with
        the model; do not write to them."""
        masters = self._masters_by_storage()
        if self.lora is None:
            return {k: masters.get(v.data_ptr(), v) for k, v in self.model.state_dict().items()}
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        # peft wraps each adapted layer: its weight and bias live under `base_layer`
        state = {name.replace(".base_layer.", "."): tensor.float() if tensor.is_floating_point()
                 else tensor
                 for name, tensor in base.state_dict().items() if "lora_" not in name}
        with torch.no_grad():
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer):
                    merged = module.get_base_layer().weight.float().clone()
                    for adapter in module.active_adapters:
                        merged += module.get_delta_weight(adapter).float()
                    state[f"{name}.weight"] = merged
        return state

    def save_merged(self, directory: Path) -> None:
        """Save the model as a plain fp32 transformers checkpoint (``merged_state_dict``)."""
        base = self.model.get_base_model() if self.lora is not None else self.model
        base.save_pretrained(directory, state_dict=self.merged_state_dict())
        config_file = Path(directory) / "config.json"
        config = json.loads(config_file.read_text())
        for key in ("torch_dtype", "dtype"):  # the tensors are fp32 whatever the live model's
            if key in config:
                config[key] = "float32"
        config_file.write_text(json.dumps(config, indent=2))

    def save_adapter(self, directory: Path, base_model: str) -> None:
        """Save the LoRA adapters alone, fp32 (peft's ``adapter_config.json`` and
        ``adapter_model.safetensors``: megabytes), naming ``base_model`` as their base, so
        ``hf:DIRECTORY`` loads them merged into it (``HFBackend``) and ``lora.init_from``
        continues them."""
        if self.lora is None:
            raise ValueError("save_adapter: this learner trains the whole model, not adapters; "
                             "use save_merged")
        # save_embedding_layers="auto" would ask the hub whether the base's vocabulary changed
        # (a warning per save where the base is a short name or the hub is unreachable): it never
        # does here, so the embeddings are never saved with the adapters
        self.model.save_pretrained(directory, save_embedding_layers=False)
        config_file = Path(directory) / "adapter_config.json"
        config = json.loads(config_file.read_text())
        config["base_model_name_or_path"] = base_model
        config["inference_mode"] = True
        config_file.write_text(json.dumps(config, indent=2))

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """What changes in training: the whole model's weights, or only the LoRA adapters;
        fp32 masters where the model holds a rounded copy."""
        masters = self._masters_by_storage()
        return {k: masters.get(v.data_ptr(), v).detach().cpu().clone()
                for k, v in self._live_state().items()}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        load_trainable_state(self.model if self.lora is not None else self.base_model, state,
                             lora=self.lora is not None)
        masters = self._masters_by_storage()
        with torch.no_grad():  # the masters take the state's full precision, not the rounding
            for key, live in self._live_state().items():
                master = masters.get(live.data_ptr())
                if master is not None and key in state:
                    master.copy_(state[key])

    def optimizer_state(self) -> dict[str, Any]:
        """AdamW's state (and the fp16 loss scaler's), for checkpoints."""
        state: dict[str, Any] = {"optimizer": self.optimizer.state_dict()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
