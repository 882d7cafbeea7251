"""``crl train CONFIG --dry-run``: check that a run can start, and print its plan, training nothing.

Holds ``dry_run`` (the checks and the plan, printed), ``make_plan`` (the same, returned as a
``Plan``) and ``DryRunError`` (the problems found, one line each). The checks: every model spec
resolves to files on this machine (a LoRA adapter folder and its base), and every env of
``tasks.envs`` is made with its kwargs and reset once (its data and extras present); the config's
own checks (keys, seeds disjoint, LoRA targets) ran when it loaded. Models are counted on the
meta device from their config file, so no weights are read and a large config checks in seconds.
No run folder is created.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from crl_envs.errors import UserFacingError, describe_error

__all__ = ["DryRunError", "EnvPlan", "ModelPlan", "Plan", "make_plan", "print_plan", "dry_run"]

_ADAMW_BYTES = 8  # two fp32 moments a trained parameter
_FP32 = 4


class DryRunError(UserFacingError):
    """What keeps a config from running: ``problems`` holds one line for each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class EnvPlan:
    """One env of the mixture, as one reset found it."""

    env_id: str
    weight: float
    kwargs: dict[str, Any]
    options: dict[str, Any]
    turns: int | None
    """the step limit (``max_episode_steps``), None when the env has none"""
    prompt_tokens: int
    """tokens of the first prompt (system prompt and first observation) with the actor's
    tokenizer"""


@dataclass
class ModelPlan:
    """One model: where it comes from, its size and what training it holds in memory."""

    role: str
    spec: str
    source: str
    """the folder (or hub id, or GGUF file) its config is read from; the base of adapters"""
    params: int
    trained: int
    """parameters the optimiser updates (LoRA: the adapters'); 0 for a frozen model"""
    dtype: str
    engine: str
    kv_tokens: int
    kv_bytes_per_token: int

    @property
    def dtype_bytes(self) -> int:
        return {"float32": 4, "bfloat16": 2, "float16": 2}[self.dtype]

    def memory(self) -> dict[str, int]:
        """Bytes by what holds them: weights, gradients, fp32 masters, AdamW state, KV cache
        and a vLLM engine's copy of the weights."""
        parts = {"weights": self.params * self.dtype_bytes,
                 "grads": self.trained * self.dtype_bytes,
                 "fp32 masters": self.trained * _FP32 if self.dtype != "float32" else 0,
                 "AdamW": self.trained * _ADAMW_BYTES,
                 "KV cache": self.kv_tokens * self.kv_bytes_per_token,
                 "vLLM weights": self.params * self.dtype_bytes if self.engine == "vllm" else 0}
        return {name: size for name, size in parts.items() if size}


@dataclass
class Plan:
    """What a run of the config would do each step, and what it holds."""

    name: str
    arm: str
    steps: int
    groups_per_step: int
    group_size: int
    guided_per_group: int
    max_new_tokens: int
    envs: list[EnvPlan] = field(default_factory=list)
    models: list[ModelPlan] = field(default_factory=list)
    checkpoint_bytes: int = 0
    keep_checkpoints: int = 1

    @property
    def episodes_per_step(self) -> int:
        return self.groups_per_step * self.group_size

    def tokens_per_step(self) -> int | None:
        """Prompt and reply tokens of a step, estimated: every turn of an episode as long as its
        first prompt plus ``max_new_tokens``, every episode as long as its env's step limit, the
        envs in the proportion of their weights. None when an env has no step limit."""
        total_weight = sum(env.weight for env in self.envs)
        per_episode = 0.0
        for env in self.envs:
            if env.turns is None:
                return None
            per_episode += env.weight / total_weight * env.turns * (env.prompt_tokens
                                                                    + self.max_new_tokens)
        return round(per_episode * self.episodes_per_step)


def _line(err: BaseException) -> str:
    """``err`` in one line: a user-facing message as it is, else ``describe_error``'s."""
    text = str(err) if isinstance(err, UserFacingError) else describe_error(err)
    return " ".join(text.split())


def _gb(size: float) -> str:
    return f"{size / 1e9:.2f} GB"


def _locate(target: str) -> tuple[str, dict[str, Any], Path | None]:
    """``(source, from_pretrained kwargs, adapter folder or None)`` of a model name or path,
    from local files only (a short name's packaged GGUF when it is not converted yet; a hub id
    only from the Hugging Face cache); ``ModelNotFoundError`` / ``ModelLoadError`` otherwise."""
    from crl_envs.data import cache_dir
    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.model_folder import adapter_base, check_model_folder, is_adapter_folder
    from crl_harness.models.names import MODELS, _packaged_gguf, resolve_model_path

    if target in MODELS:
        cached = cache_dir() / "models" / target
        if (cached / "config.json").is_file():
            return str(cached), {}, None
        gguf = _packaged_gguf(target, MODELS[target])
        return str(gguf.parent), {"gguf_file": gguf.name}, None
    path = Path(resolve_model_path(target)).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return str(path.parent), {"gguf_file": path.name}, None
    if path.is_dir():
        if is_adapter_folder(path):
            source, extra, _ = _locate(adapter_base(path))
            return source, extra, path
        check_model_folder(path)
        return str(path), {}, None
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(target, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ModelNotFoundError(
            f"{target} is neither a local model folder nor in this machine's Hugging Face cache; "
            f"give a folder (save_pretrained), a short name such as smollm2-135m, or download it "
            f"first (huggingface-cli download {target})") from err
    return target, {}, None


def _count(source: str, extra: dict[str, Any], lora: Any) -> tuple[int, int, int, Any]:
    """``(parameters, LoRA adapter parameters, KV bytes per token in fp32, config)`` of the model
    that ``source`` configures, built on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from crl_harness.models.kv_cache import KVLayout

    config = AutoConfig.from_pretrained(source, **extra)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    params = sum(p.numel() for p in model.parameters())
    layers = getattr(config, "num_hidden_layers", 0) or 0
    lowest = layers - lora.top_layers if lora.top_layers else 0
    adapters = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or \
                not any(name == t or name.endswith(f".{t}") for t in lora.target_modules):
            continue
        index = next((int(part) for part in name.split(".") if part.isdigit()), None)
        if index is None or index >= lowest:
            adapters += lora.r * (module.in_features + module.out_features)
    try:
        kv = KVLayout.of(config).bytes_per_token(torch.float32)
    except (ValueError, AttributeError):
        kv = 0
    return params, adapters, kv, config


def _models(cfg: Any, problems: list[str]) -> tuple[list[ModelPlan], Any]:
    """The models of ``cfg`` and the actor's tokenizer (None when the actor cannot be found)."""
    import torch

    from crl_harness.models.hf_loading import resolve_device, resolve_dtype

    roles = [("actor", cfg.actor.model, True)]
    if cfg.uses_experience:
        spec = cfg.actor.model if cfg.extractor.model == "same" else cfg.extractor.model
        roles.append(("extractor", spec, cfg.trains_extractor))
    plans: list[ModelPlan] = []
    tokenizer = None
    for role, spec, trained in roles:
        section = getattr(cfg, role)
        kind, _, target = spec.partition(":")
        if kind == "openai":
            continue  # served elsewhere: nothing here to check or to hold
        key = f"{role}.model" if role == "actor" or cfg.extractor.model != "same" else "actor.model"
        try:
            source, extra, adapter = _locate(target)
            params, adapters, kv_fp32, _ = _count(source, extra, section.lora)
            if role == "actor":
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(source, **extra)
        except Exception as err:  # noqa: BLE001 - each problem is reported, then the next checked
            line = f"{key} {spec}: {_line(err)}"
            if line not in problems:  # the extractor "same" as a missing actor: said once
                problems.append(line)
            continue
        dtype = resolve_dtype(section.dtype, resolve_device(torch, "auto"))
        n_trained = (adapters if section.lora.enabled else params) if trained else 0
        kv_tokens = cfg.kv_cache_tokens(role)
        where = source + (f"#{extra['gguf_file']}" if extra else "")
        plans.append(ModelPlan(role=role, spec=spec, source=f"adapters on {where}" if adapter
                               else where, params=params, trained=n_trained,
            dtype=dtype, engine=section.rollout_engine, kv_tokens=kv_tokens,
            kv_bytes_per_token=kv_fp32 * {"float32": 4, "bfloat16": 2, "float16": 2}[dtype] // 4))
    return plans, tokenizer


def _envs(cfg: Any, tokenizer: Any, problems: list[str]) -> list[EnvPlan]:
    """Make and reset every env of the mixture once, on the first training seed."""
    import crl_envs  # noqa: F401 - registers the CRL ids
    from crl_harness.experience.entries import clean_text
    from crl_harness.models.base import encode_chat
    from crl_harness.prompting import system_prompt
    from crl_harness.rollout import make_env

    seed = int(cfg.tasks.training_seeds()[0])
    plans: list[EnvPlan] = []
    for index, entry in enumerate(cfg.tasks.envs):
        kwargs, options = dict(entry.kwargs), dict(entry.options)
        env = None
        try:
            env = make_env(entry.id, **kwargs)
            observation, info = env.reset(seed=seed, options=options or None)
            instructions = clean_text(info.get("instructions")
                                      or getattr(env.unwrapped, "instructions", "") or "")
            observation = clean_text(observation)
            task = clean_text(info.get("task", "") or "")
            system = system_prompt(instructions, task="" if task in observation else task)
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": observation}]
            tokens = len(encode_chat(tokenizer, messages)) if tokenizer is not None else 0
            turns = env.spec.max_episode_steps if env.spec is not None else None
        except Exception as err:  # noqa: BLE001 - each problem is reported, then the next checked
            problems.append(f"tasks.envs.{index} {entry.id} {kwargs}: {_line(err)}")
            continue
        finally:
            if env is not None:
                env.close()
        plans.append(EnvPlan(env_id=entry.id, weight=entry.weight, kwargs=kwargs,
                             options=options, turns=turns, prompt_tokens=tokens))
    return plans


def make_plan(cfg: Any) -> Plan:
    """Check ``cfg`` (a loaded ``TrainConfig``) against this machine and return its plan, or
    raise ``DryRunError`` with one line for each model or env that cannot be used."""
    from crl_harness.models.engines import resolve_rollout_engines

    resolve_rollout_engines(cfg)  # the plan holds a vLLM copy's memory where auto means vllm
    problems: list[str] = []
    models, tokenizer = _models(cfg, problems)
    envs = _envs(cfg, tokenizer, problems)
    if problems:
        raise DryRunError(problems)
    t = cfg.tasks
    plan = Plan(name=cfg.name, arm=cfg.arm, steps=cfg.run.steps, groups_per_step=t.groups_per_step,
                group_size=t.group_size, guided_per_group=t.guided_per_group if cfg.uses_experience
                else 0, max_new_tokens=cfg.actor.max_new_tokens, envs=envs, models=models,
                keep_checkpoints=cfg.run.keep_checkpoints)
    for model in models:
        plan.checkpoint_bytes += model.trained * (_FP32 + _ADAMW_BYTES)
        if model.role == "actor":  # actor_hf: its adapters, or the whole model, in fp32
            lora = cfg.actor.lora.enabled
            plan.checkpoint_bytes += (model.trained if lora else model.params) * _FP32
    return plan


def print_plan(plan: Plan, out: TextIO | None = None) -> None:
    """The plan as plain lines."""
    out = out or sys.stdout
    total_weight = sum(env.weight for env in plan.envs)
    lines = [f"Dry run of {plan.name} (arm {plan.arm}, {plan.steps} steps): models and envs "
             "check out; nothing was trained and no run folder was written.", "Envs (tasks.envs):"]
    for env in plan.envs:
        turns = env.turns if env.turns is not None else "no limit"
        lines.append(f"  {env.env_id}  weight {env.weight:g} ({env.weight / total_weight:.0%})  "
                     f"kwargs {env.kwargs}  options {env.options}  turns cap {turns}  "
                     f"first prompt {env.prompt_tokens:,} tokens")
    guided = f" ({plan.guided_per_group} guided + {plan.group_size - plan.guided_per_group} free " \
        "per group)" if plan.guided_per_group else ""
    lines.append(f"Episodes per step: {plan.groups_per_step} groups x {plan.group_size} = "
                 f"{plan.episodes_per_step}{guided}")
    tokens = plan.tokens_per_step()
    lines.append("Tokens per step: " + (
        f"~{tokens:,} (estimate: each turn as long as the env's first prompt plus "
        f"{plan.max_new_tokens} new tokens, each episode as long as its turns cap)"
        if tokens is not None else "unknown (an env has no turns cap)"))
    total = 0
    for model in plan.models:
        memory = model.memory()
        total += sum(memory.values())
        trained = f"{model.trained / 1e6:,.1f}M trained" if model.trained else "frozen"
        lines.append(f"Model {model.role}: {model.spec} ({model.source}), "
                     f"{model.params / 1e6:,.1f}M parameters, {trained}, {model.dtype}, "
                     f"rollout engine {model.engine}")
        parts = ", ".join(f"{name} {_gb(size)}" for name, size in memory.items())
        lines.append(f"  memory ~{_gb(sum(memory.values()))}: {parts} (KV: {model.kv_tokens:,} "
                     f"tokens x {model.kv_bytes_per_token:,} B)")
    lines.append(f"Memory, all models: ~{_gb(total)} (estimate; activations of the training "
                 "passes come on top)")
    lines.append(f"Checkpoint: ~{_gb(plan.checkpoint_bytes)} each (trained weights in fp32, AdamW "
                 f"state, the actor's export), {plan.keep_checkpoints} kept")
    print("\n".join(lines), file=out)


def dry_run(cfg: Any, out: TextIO | None = None) -> Plan:
    """Check ``cfg`` and print its plan; ``DryRunError`` (one line a problem) when it cannot run."""
    plan = make_plan(cfg)
    print_plan(plan, out)
    return plan
