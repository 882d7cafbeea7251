"""The checks of a loaded training configuration; every failure is a ``ConfigError`` whose message
names the key and what to do.

Holds:
- ``ConfigError``: a config file or override is wrong;
- ``_validate``: the checks ``load_config`` runs on every config: finite numbers, then what each
  field declares (its choices, its bounds: ``fields``), then what relates several settings (the
  env mixture, training, held-out and warm-start seeds disjoint, trainable models, LoRA adapters
  to continue); ``_check_switch`` for the true-or-false ``SWITCHES``;
- ``check_lora_fits``: the LoRA settings against their model's modules and layers, before
  training (it reads the model's config file, so it is not run at load); ``check_context_fits``:
  the replies' ``max_new_tokens`` against the model's context, likewise;
- ``own_warm_start``: whether a learner continues the adapters its config's warm start writes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import Field, fields, is_dataclass
from pathlib import Path
from typing import Any

from crl_harness.config.fields import bounds_problem, choice_problem, finite_problem
from crl_harness.config.schema import HELDOUT_RESERVED, LoRAConfig, TrainConfig, WarmStartConfig
from crl_harness.models.engines import SAMPLING_ENGINES

__all__ = [
    "ConfigError",
    "check_lora_fits",
    "check_context_fits",
    "own_warm_start",
    "min_query_coverage_problem",
    "SWITCHES",
]


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key and what to do."""


SWITCHES = ("experience.actor_critic_gate", "experience.search_and_ask")
"""keys that take true or false only (OmegaConf alone would read 2 or "on" as true)"""


def _check_switch(key: str, value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: bad config key '{key}': must be true or false, got "
                          f"{value!r}")


def _settings(node: Any, prefix: str = "") -> Iterator[tuple[str, Field, Any]]:
    """``(key, field, value)`` of every setting of the config, in declaration order, through
    nested sections and lists of them (``tasks.envs.0.weight``)."""
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            yield from _settings(value, f"{key}.")
        elif isinstance(value, list) and value and is_dataclass(value[0]):
            for i, item in enumerate(value):
                yield from _settings(item, f"{key}.{i}.")
        else:
            yield key, f, value


def _declared_problem(cfg: TrainConfig) -> tuple[str, str] | None:
    """``(key, why)`` of the first setting that is NaN or infinite (every bound compares, and
    NaN passes every comparison), else of the first outside what its field declares (``choice``,
    then ``bounded``: a section shared by several, ``LoRAConfig``, is reported under each key)."""
    settings = list(_settings(cfg))
    for check in (lambda f, v: finite_problem(v), choice_problem, bounds_problem):
        for key, f, value in settings:
            problem = check(f, value)
            if problem is not None:
                return key, problem
    return None


def min_query_coverage_problem(retrieval: str, min_query_coverage: float | None) -> str | None:
    """A coverage floor with an index that does not read words (``experience.retrieval`` other
    than bm25), named; else None."""
    if min_query_coverage and retrieval != "bm25":
        return ("counts the query's words in an entry, which only experience.retrieval: bm25 "
                "reads; set it 0 with dense retrieval")
    return None


def _validate(cfg: TrainConfig, source: str) -> None:
    import crl_envs

    def fail(key: str, why: str) -> None:
        raise ConfigError(f"{source}: bad config key '{key}': {why}")

    declared = _declared_problem(cfg)
    if declared is not None:
        fail(*declared)
    t = cfg.tasks
    if not t.envs:
        fail("tasks.envs", "the mixture is empty; list at least one env")
    if not math.isfinite(sum(env.weight for env in t.envs)):
        fail("tasks.envs", "the weights add up to more than a float holds; they are relative, "
             "so scale them down (e.g. 1 and 3)")
    for i, env in enumerate(t.envs):
        if env.id not in crl_envs.env_ids():
            fail(f"tasks.envs.{i}.id", f"unknown env '{env.id}'; known: {', '.join(crl_envs.env_ids())}")
        if env.kwargs:
            try:
                crl_envs.check_make_kwargs(env.id, env.kwargs)
            except ValueError as err:
                fail(f"tasks.envs.{i}.kwargs", str(err))
    if cfg.arm != "none" and not 0 < t.guided_per_group < t.group_size:
        fail("tasks.guided_per_group", f"must be in 1..{t.group_size - 1} with arm={cfg.arm}")
    if t.seeds is not None:
        if not t.seeds:
            fail("tasks.seeds", "the list is empty; list at least one seed, or null for the "
                 "range tasks.seed_offset + tasks.seed_count")
        if min(t.seeds) < 0:
            fail("tasks.seeds", f"seeds must be >= 0, got {min(t.seeds)}")
        if len(set(t.seeds)) != len(t.seeds):
            fail("tasks.seeds", "a seed is listed twice; list each level once")
    e = cfg.experience
    if e.candidates < e.k:
        fail("experience.candidates", f"must be >= experience.k ({e.k}), got {e.candidates}")
    if e.initial_bank and _is_sqlite(Path(e.initial_bank).expanduser()):
        fail("experience.initial_bank", f"{e.initial_bank} is a bank file (SQLite); give its "
             "JSONL export instead, e.g. a checkpoint's bank.jsonl")
    coverage = min_query_coverage_problem(e.retrieval, e.min_query_coverage)
    if coverage is not None:
        fail("experience.min_query_coverage", coverage)
    if cfg.arm == "none":
        for key in SWITCHES:
            if getattr(cfg.experience, key.removeprefix("experience.")):
                fail(key, "needs experience, and arm=none retrieves none; set it false or use "
                     "arm=co-evolve / arm=static")
    # The learners train a transformers model in this process; vllm: and openai: name none, and
    # an OpenAI server cannot be given new weights.
    if not cfg.actor.model.startswith("hf:"):
        fail("actor.model", f"'{cfg.actor.model}' cannot be trained: the trainer updates an "
             "hf: model in its own process; use hf:NAME_OR_PATH, with actor.rollout_engine: "
             "vllm for vLLM rollouts (openai: serves crl eval only)")
    for key in ("actor", "extractor"):
        learner = getattr(cfg, key)
        if learner.rollout_engine in SAMPLING_ENGINES and cfg.run.backend == "ray" \
                and not SAMPLING_ENGINES[learner.rollout_engine].own_model:
            fail(f"{key}.rollout_engine", f"{learner.rollout_engine} runs in the trainer's "
                 "process (run.backend: local); with run.backend: ray use hf")
    if cfg.trains_extractor and cfg.extractor.model != "same" \
            and not cfg.extractor.model.startswith("hf:"):
        fail("extractor.model", f"'{cfg.extractor.model}' cannot be trained (arm co-evolve): "
             "use same or hf:NAME_OR_PATH, or arm=static for a frozen extractor")
    ranges = {"training": range(t.seed_offset, t.seed_offset + t.seed_count),
              "held-out": range(t.heldout_offset, t.heldout_offset + HELDOUT_RESERVED)}
    if t.seeds is not None:  # the explicit pool replaces the range
        del ranges["training"]

    def overlap(a: range, b: range) -> bool:
        return a.start < b.stop and b.start < a.stop

    if t.seeds is None and overlap(ranges["training"], ranges["held-out"]):
        fail("tasks.heldout_offset", f"the held-out seeds [{t.heldout_offset}, "
             f"{t.heldout_offset + HELDOUT_RESERVED}) overlap the training seeds "
             f"[{t.seed_offset}, {t.seed_offset + t.seed_count}); held-out tasks must be unseen")
    for key in ("actor", "extractor", "warmstart"):
        if not getattr(cfg, key).lora.target_modules:
            fail(f"{key}.lora.target_modules", "is empty; name the modules that get adapters "
                 "(e.g. q_proj, v_proj)")
    w = cfg.warmstart
    if w.lora.init_from is not None:
        fail("warmstart.lora.init_from", "the warm start trains fresh adapters; leave it null "
             "(actor.lora.init_from continues a warm start's adapters in RL)")
    for learner in ("actor", "extractor"):
        if learner == "extractor" and not cfg.trains_extractor:
            continue
        problem = _lora_init_problem(cfg, learner)
        if problem is not None:
            fail(*problem)
    if not w.model.startswith("hf:"):
        fail("warmstart.model", f"'{w.model}' cannot be fine-tuned here; use hf:NAME_OR_PATH")
    if not w.lora.enabled:
        fail("warmstart.lora.enabled", "the warm start trains LoRA adapters only; keep it true")
    problem = _warm_extractor_init_problem(w)
    if problem is not None:
        fail(*problem)
    if w.extractor_merges and w.extractor_lesson != "key":
        fail("warmstart.extractor_merges", "merge samples fold the lessons of one retrieval key "
             "into the env's lesson of that key; set warmstart.extractor_lesson=key, or 0")
    if w.extractor_merges and not w.extractor_samples:
        fail("warmstart.extractor_merges", "warmstart.extractor_samples is 0, so no extractor "
             "is warm-started; set it (e.g. 64), or 0")
    warm = w.seeds()
    for name, seeds in (("held-out", ranges["held-out"]), ("warm-start", warm)):
        inside = sorted(s for s in t.seeds or () if s in seeds)
        if inside:
            fail("tasks.seeds", f"seed {inside[0]} is one of the {name} seeds [{seeds.start}, "
                 f"{seeds.stop}); training levels must differ from them")
    for name, seeds in ranges.items():
        if overlap(warm, seeds):
            fail("warmstart.seed_offset", f"the warm-start seeds [{warm.start}, {warm.stop}) "
                 f"overlap the {name} seeds [{seeds.start}, {seeds.stop}); move one range")


def _is_sqlite(path: Path) -> bool:
    """Whether ``path`` is a readable file that starts as every SQLite database does."""
    try:
        if not path.is_file():  # a FIFO would block the read
            return False
        with open(path, "rb") as handle:
            return handle.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False  # missing or unreadable: the trainer says so when it opens it


def _model_key(name: str) -> str:
    """What ``name`` (a short name, a path, an ``assets/...`` path, a hub id) loads, as one
    comparable string: a short name and its cached checkpoint are the same model. Nothing is
    downloaded or converted."""
    from crl_envs.data import cache_dir
    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.names import MODELS, resolve_model_path

    if name in MODELS:
        return str((cache_dir() / "models" / name).resolve())
    try:
        path = Path(resolve_model_path(name)).expanduser()
    except ModelNotFoundError:
        return name
    return str(path.resolve()) if path.exists() else name


def _lora_init_problem(cfg: TrainConfig, learner: str, *, at_load: bool = True
                       ) -> tuple[str, str] | None:
    """``(key, why)`` when ``{learner}.lora.init_from`` cannot be continued on that learner's
    model: LoRA is off, the folder holds no adapters, or they were trained on another base. At
    load, the config's own warm start output passes until it holds adapters (``crl warmstart``
    writes them)."""
    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.model_folder import is_adapter_folder
    from crl_harness.models.names import resolve_model_path

    section = getattr(cfg, learner)
    lora: LoRAConfig = section.lora
    if lora.init_from is None:
        return None
    key = f"{learner}.lora.init_from"
    if not lora.enabled:
        return key, f"continues adapters, so {learner}.lora.enabled must be true as well"
    try:
        folder = Path(resolve_model_path(lora.init_from)).expanduser()
    except ModelNotFoundError as err:
        return None if at_load and own_warm_start(cfg, learner) else (key, str(err))
    if not is_adapter_folder(folder):
        if at_load and own_warm_start(cfg, learner):
            return None
        return key, (f"{lora.init_from} is not a LoRA adapter folder (no adapter_config.json); "
                     "give one written by crl warmstart (e.g. assets/warmstart/cpu-demo/actor) "
                     "or a LoRA run's checkpoints/step-N/actor_hf")
    spec = cfg.actor.model if learner == "extractor" and cfg.extractor.model == "same" \
        else section.model
    model_key = f"{learner}.model" if spec == section.model else "actor.model"
    return _adapter_base_problem(folder, key, spec, model_key)


def _adapter_base_problem(folder: Path, key: str, spec: str, model_key: str
                          ) -> tuple[str, str] | None:
    """``(key, why)`` when the adapters in ``folder`` (set by ``key``) cannot be continued on
    ``spec`` (the model ``model_key`` names): that model is itself an adapter folder, or the
    adapters were trained on another base."""
    from crl_harness.models.base import ModelLoadError, ModelNotFoundError
    from crl_harness.models.model_folder import adapter_base, is_adapter_folder
    from crl_harness.models.names import resolve_model_path

    try:
        base = adapter_base(folder)
    except ModelLoadError as err:
        return key, str(err)
    model = spec.removeprefix("hf:")
    try:
        model_is_adapter = is_adapter_folder(Path(resolve_model_path(model)).expanduser())
    except ModelNotFoundError:
        model_is_adapter = False
    if model_is_adapter:
        return key, (f"{model_key} {spec} is itself an adapter folder (merged into its base at "
                     f"load, so the adapters would count twice); with {key} give the base: "
                     f"{model_key}=hf:{base}")
    if _model_key(base) != _model_key(model):
        return key, (f"{folder} holds adapters of {base}, not of {model_key} {spec}; "
                     f"set {model_key}=hf:{base} or give adapters of {model}")
    return None


def _warm_extractor_init_problem(w: WarmStartConfig) -> tuple[str, str] | None:
    """``(key, why)`` when ``warmstart.extractor_init_from`` cannot be continued by the warm
    start's extractor fit: no adapter folder there, or adapters of another base than
    ``warmstart.model``."""
    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.model_folder import is_adapter_folder
    from crl_harness.models.names import resolve_model_path

    key = "warmstart.extractor_init_from"
    if w.extractor_init_from is None:
        return None
    if not w.extractor_samples:
        return key, ("continues an extractor on new samples, but warmstart.extractor_samples is "
                     "0 (nothing to fit); set it, or leave the key null")
    try:
        folder = Path(resolve_model_path(w.extractor_init_from)).expanduser()
    except ModelNotFoundError as err:
        return key, str(err)
    if not is_adapter_folder(folder):
        return key, (f"{w.extractor_init_from} is not a LoRA adapter folder (no "
                     "adapter_config.json); give an extractor a warm start wrote (OUT/extractor)")
    return _adapter_base_problem(folder, key, w.model, "warmstart.model")


def own_warm_start(cfg: TrainConfig, learner: str) -> bool:
    """Whether ``{learner}.lora.init_from`` names the adapters this config's own warm start
    writes (``warmstart.output_dir``/``actor`` or ``/extractor``): a config that continues them
    loads before they exist (``crl warmstart`` and ``crl demo`` make them); ``check_lora_fits``
    checks them before training."""
    init_from = getattr(cfg, learner).lora.init_from
    return init_from is not None and Path(init_from).expanduser().resolve() == \
        (Path(cfg.warmstart.output_dir).expanduser() / learner).resolve()


def check_lora_fits(cfg: TrainConfig, learners: Sequence[str]) -> None:
    """The LoRA settings of ``learners`` (``actor``, ``extractor``, ``warmstart``) against their
    model: every target module names a module of it and ``top_layers`` is at most its layers, or
    a ``ConfigError`` naming the key. The model is built from its config file on the meta device
    (no weights are read), so this runs before any model loads."""
    import torch
    from transformers import AutoModelForCausalLM

    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.names import resolve_model_path

    specs = {"actor": cfg.actor.model, "warmstart": cfg.warmstart.model,
             "extractor": cfg.actor.model if cfg.extractor.model == "same" else cfg.extractor.model}
    for learner in learners:
        lora: LoRAConfig = getattr(cfg, learner).lora
        if not lora.enabled or (learner == "extractor" and not cfg.trains_extractor):
            continue
        if learner != "warmstart" and lora.init_from is not None:
            try:  # a checkout's or an installed copy's shipped warm start counts
                made = Path(resolve_model_path(lora.init_from)).expanduser().exists()
            except ModelNotFoundError:
                made = False
            if own_warm_start(cfg, learner) and not made:
                raise ConfigError(f"bad config key '{learner}.lora.init_from': {lora.init_from} "
                                  f"does not exist yet; `crl warmstart {cfg.name}` writes it (or "
                                  "point it at other adapters)")
            problem = _lora_init_problem(cfg, learner, at_load=False)
            if problem is not None:
                raise ConfigError(f"bad config key '{problem[0]}': {problem[1]}")
        if lora.init_from is not None:  # its own adapter_config.json fixes the shape (load time)
            continue
        config = _model_config(specs[learner])
        if config is None:
            continue  # no such model: loading it (or the dry run) says so in one line
        with torch.device("meta"):
            names = [name for name, _ in AutoModelForCausalLM.from_config(config).named_modules()]
        # peft's rule: a target matches a module named it or ending in ".TARGET"
        unmatched = [t for t in lora.target_modules
                     if not any(n == t or n.endswith(f".{t}") for n in names)]
        if unmatched:
            known = sorted({n.rsplit(".", 1)[-1] for n in names if n.endswith("proj")})
            raise ConfigError(f"bad config key '{learner}.lora.target_modules': "
                              f"{', '.join(unmatched)} match no module of {specs[learner]}; its "
                              f"projections are: {', '.join(known)}")
        layers = getattr(config, "num_hidden_layers", None)
        if layers is not None and lora.top_layers > layers:
            raise ConfigError(f"bad config key '{learner}.lora.top_layers': {specs[learner]} has "
                              f"{layers} layers, got {lora.top_layers}")


def _model_config(spec: str) -> Any:
    """The transformers config of the ``hf:`` model ``spec`` (an adapter folder's base), read
    from its config file without its weights; None when it is not on this machine (loading it
    says so) or ``spec`` is not an ``hf:`` model."""
    from transformers import AutoConfig

    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.model_folder import adapter_base, is_adapter_folder
    from crl_harness.models.names import resolve_model_path

    if not spec.startswith("hf:"):
        return None
    try:
        path = resolve_model_path(spec.removeprefix("hf:"))
        if is_adapter_folder(Path(path)):  # adapters are merged into their base first
            path = resolve_model_path(adapter_base(Path(path)))
        return AutoConfig.from_pretrained(path)
    except (ModelNotFoundError, OSError, ValueError):
        return None


def check_context_fits(cfg: TrainConfig) -> None:
    """``actor.max_new_tokens`` and ``extractor.max_new_tokens`` against their model's context
    (its ``max_position_embeddings``, read from its config file, as the trainer's backends take
    it): a reply may take at most half of it, the rest is for the prompt (``crl eval
    --max-new-tokens`` has the same bound), or a ``ConfigError`` naming the key. Run before a
    run folder is made, and before ``--dry-run`` says the models check out."""
    specs = {"actor": cfg.actor.model}
    if cfg.uses_experience:  # arm none never runs the extractor
        specs["extractor"] = cfg.actor.model if cfg.extractor.model == "same" \
            else cfg.extractor.model
    for learner, spec in specs.items():
        config = _model_config(spec)
        context = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None) \
            if config is not None else None
        tokens = getattr(cfg, learner).max_new_tokens
        if isinstance(context, int) and tokens > context // 2:
            raise ConfigError(f"bad config key '{learner}.max_new_tokens': {spec} has a context "
                              f"of {context} tokens and a reply may take at most half of it "
                              f"({context // 2}), got {tokens}")
