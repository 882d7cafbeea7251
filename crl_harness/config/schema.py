"""The training configuration's schema: one dataclass per concern, each setting declared once with
its default and, right under it, its docstring.

Holds:
- ``TrainConfig``: the whole run, and what follows from it (``uses_experience``,
  ``trains_extractor``, ``starting_model``, ``kv_cache_tokens``, ``retrieval_warmup``,
  ``actor_warmup``);
- its parts ``RunConfig``, ``TaskConfig`` (+ ``EnvEntry``), ``ExperienceConfig``,
  ``WarmStartConfig``, and the learners' ``ActorConfig``, ``ExtractorConfig`` and ``LoRAConfig``
  (``crl_harness.config.learners``);
- ``updated_lesson_steps``: how many steps of a run can retrieve what a trained extractor wrote;
- ``DTYPES``, ``HELDOUT_RESERVED``, ``EXTRACTOR_LEVELS_PER_SAMPLE``.

A setting's allowed values are declared on it (``fields``: ``choice``, ``bounded``) and checked
by ``validation``; checks that relate several settings live there.

The defaults are the paper's released settings (docs/method.md, which also lists where this code
departs). Nothing here loads or checks a config: ``loading`` and ``validation`` do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from crl_harness.config.fields import bounded, choice
from crl_harness.config.learners import DTYPES, ActorConfig, ExtractorConfig, LoRAConfig
from crl_harness.models.hf_loading import BF16_IF_NATIVE

__all__ = [
    "EnvEntry",
    "TaskConfig",
    "LoRAConfig",
    "ActorConfig",
    "ExtractorConfig",
    "ExperienceConfig",
    "RunConfig",
    "WarmStartConfig",
    "TrainConfig",
    "updated_lesson_steps",
    "DTYPES",
    "HELDOUT_RESERVED",
    "EXTRACTOR_LEVELS_PER_SAMPLE",
]


HELDOUT_RESERVED = 10_000
EXTRACTOR_LEVELS_PER_SAMPLE = 8
"""levels the warm start may play for each extractor sample (cpu-demo's 128 balanced samples
come from its first 91 levels; lost episodes are the rarer)"""


@dataclass
class EnvEntry:
    """One env of the task mixture."""

    id: str = "CRL/MiniHackRoom-v0"
    """a registered CRL env id"""
    weight: float = bounded(1.0, gt=0)
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
    groups_per_step: int = bounded(16, ge=1)
    """task seeds per step (released: 16 groups x 8 = 128 rollouts)"""
    group_size: int = bounded(8, ge=2, why="advantages compare rollouts of a group")
    """G, rollouts per seed"""
    guided_per_group: int = 4
    """rollouts of a group that get retrieved experience (released: 4 of 8); 0 with arm=none"""
    seed_offset: int = bounded(0, ge=0)
    """training seeds are drawn from [seed_offset, seed_offset + seed_count)"""
    seed_count: int = bounded(1_000_000, ge=1)
    """size of the training seed range (a small range makes the training tasks recur across
    steps, as the paper's training sets do)"""
    seeds: Optional[list[int]] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """an explicit pool of training seeds, drawn uniformly, instead of the range above (which is
    then unused), e.g. levels whose retrieval keys differ
    (``benchmarks/retrieval_oracle.py --print-seeds``)"""
    schedule: str = choice("uniform", "revisit")
    """how levels recur: ``uniform`` (each group's seed uniform over the pool, distinct within a
    step) or ``revisit`` (step 1 all new levels; each later step ``new_per_step`` new ones and
    revisits of the levels the previous step played first, so every level is played first
    without a lesson and again once the bank may hold one: ``TaskSampler``)"""
    new_per_step: Optional[int] = bounded(  # noqa: UP045 (OmegaConf reads typing.Optional)
        None, ge=0, why="0: every step after the first only revisits")
    """``revisit``: new levels a step after the first plays (the others revisit; at most
    ``groups_per_step``); null: half the groups"""
    heldout_offset: int = bounded(50_000_000, ge=0)
    """held-out tasks for evaluation: seeds heldout_offset, heldout_offset+1, ... (the next
    HELDOUT_RESERVED seeds are kept out of training and the warm start)"""

    def new_levels_per_step(self) -> int:
        """``new_per_step`` (at most ``groups_per_step``), or half the groups (rounded up) when
        null."""
        if self.new_per_step is not None:
            return min(self.new_per_step, self.groups_per_step)
        return (self.groups_per_step + 1) // 2

    def training_seeds(self) -> Sequence[int]:
        """The training levels: ``seeds`` when listed, else the range (not listed out)."""
        if self.seeds is not None:
            return list(self.seeds)
        return range(self.seed_offset, self.seed_offset + self.seed_count)


@dataclass
class ExperienceConfig:
    """The experience bank, its retrieval and its Experience Manager."""

    k: int = bounded(1, ge=1, le=100, why="each entry goes into the prompt")
    """entries retrieved per guided episode (released: top-1)"""
    capacity: int = bounded(20_000, ge=1)
    """bank entries, first-in-first-out eviction"""
    merge_every: int = bounded(5, ge=0, why="0: no merge pass")
    """actor steps between merge passes (0: none, for an extractor whose warm start taught no
    merges, ``warmstart.extractor_merges``: an untaught merge pass rewrites right lessons into
    wrong ones)"""
    max_concurrent_extractions: int = bounded(4, ge=1)
    """extractor calls the manager runs at once (they are batched into one generate call)"""
    retrieval: str = choice("bm25", "dense")
    """released: dense embeddings; bm25 needs no embedding model"""
    candidates: int = bounded(16, ge=1)
    """top-relevance entries the diversity re-rank chooses from (released: 16)"""
    count_penalty: float = bounded(0.4, ge=0)
    """re-rank: subtracted per log(1 + times an entry was retrieved) from its relevance (released:
    0.4); 0 with ``demotion_prob: 0`` turns the re-rank off, right for a small bank whose levels
    recur, where the right entry is the much-retrieved one"""
    demotion_prob: float = bounded(0.5, ge=0, le=1)
    """re-rank: probability that an entry retrieved within ``recency_window_s`` is moved out of
    its top slot (released: 0.5)"""
    recency_window_s: float = bounded(300.0, ge=0)
    """re-rank: how long after its retrieval an entry counts as recently used (released: 300)"""
    min_query_coverage: Optional[float] = bounded(  # noqa: UP045 (OmegaConf reads typing.Optional)
        None, ge=0, le=1, why="null: 1 where the env's key is exact, else 0")
    """a floor before the re-rank: the share of the query's distinct words (``tokenize``'s) an
    entry must contain to be retrieved (0: off, as released). null (the default): 1 for the envs
    whose key names the level exactly (MiniHack's start cell and view, Sokoban's layout:
    ``crl_envs.exact_retrieval_key``), 0 for the others: a level without a lesson of its own gets
    none, not the nearest other level's route (which cost its guided episodes 11-14 points), and
    its guided episodes play as free ones. A number applies to every env (bm25 only).
    Search-and-ask's questions pass the same floor; a query without words passes"""
    credit: str = choice("outcome", "relative")
    """what a guided episode credits the writers of its entries with: ``outcome`` (paper): its
    score, 0 counting as -1; ``relative``: its score minus the mean score of its group's free
    subgroup (same level, same step, no experience), so that a lesson is credited with the help
    it gave, not with how easy its level is"""
    max_transcript_chars: int = bounded(12_000, ge=1)
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
    max_asks: int = bounded(2, ge=1)
    """search-and-ask: asks answered per episode (released: 2); later ones are refused"""
    max_query_chars: int = bounded(1_000, ge=1)
    """search-and-ask: a longer query is cut to this many characters before it is sent"""
    retrieval_warmup_steps: Optional[int] = bounded(  # noqa: UP045 (OmegaConf reads typing.Optional)
        None, ge=0, why="0: retrieve from step 1; null: follow actor.warmup_steps")
    """steps at the start during which nothing is retrieved while the bank fills: the guided
    slots play without experience (and are distilled), no writer is credited and the extractor
    is not trained; null: ``actor.warmup_steps`` (the released code's one warm-up for both), so
    configs that set only that one keep their behaviour. 0 with ``actor.warmup_steps: 0``: the
    actor trains from step 1 and guided slots retrieve once the bank holds something"""
    initial_bank: Optional[str] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """a bank export (``bank.jsonl``, e.g. a checkpoint's) whose entries a fresh run starts from;
    none: a fresh run starts with an empty bank (arm none ignores it). A bank file itself
    (``bank.sqlite``) is refused at load, naming the export to give instead"""


@dataclass
class WarmStartConfig:
    """Supervised warm start on scripted-oracle episodes (``crl warmstart``): LoRA adapters for
    the actor and the extractor that ``actor.model`` / ``extractor.model`` can start from."""

    model: str = "hf:smollm2-135m"
    """the base model both adapters are trained on (``actor.model`` / ``extractor.model`` then
    name the adapters: ``hf:OUT/actor``)"""
    episodes: int = bounded(40, ge=1)
    """oracle episodes per env of the mixture (each gives one packed actor sample)"""
    seed_offset: int = bounded(10_000_000, ge=0)
    """the episodes play seeds seed_offset, seed_offset+1, ... (``seeds()``: disjoint from the
    training and held-out ranges)"""
    noise: float = bounded(0.1, ge=0, le=1)
    """fraction of turns whose target is a random allowed action instead of the oracle's: the
    warm actor is good, not perfect, so RL has room"""
    experience_fraction: float = bounded(0.5, ge=0, le=1)
    """fraction of actor episodes whose system prompt carries the winning moves of an earlier
    attempt at the same level, which the target follows (the rest carry none)"""
    lesson_fraction: float = bounded(0.0, ge=0, le=1)
    """fraction of actor episodes, on levels whose env writes a transferable lesson for their
    key (``crl_envs.transferable_lesson``: a dark MiniHack Room's sweep from the start cell),
    that carry that lesson and follow it until the goal comes into view, then break it off and
    walk there (only won ones are kept; the rest are drawn as without it). A warm actor taught
    only routes plays a shown lesson to its end and walks past the stairs it sees. 0 (the
    default): no such episodes, the shipped adapters' recipe"""
    extractor_lesson: str = choice("route", "key")
    """what the extractor's samples teach it to add (and the episodes its votes judge follow):
    ``route``, the level's own winning moves (a lesson of that level alone); ``key``, where the
    env writes one (``crl_envs.transferable_lesson``), the lesson that holds for every level of
    the retrieval key (a dark Room's sweep from the start cell), which unseen levels of the key
    can use; levels without one keep their route. ``route`` (the default): the shipped
    adapters' recipe"""
    extractor_samples: int = bounded(16, ge=0)
    """extractor samples (the Experience Manager's prompt for a warm-start episode and an
    operations answer built from it), as many answering add, return, upvote and downvote
    (4 divides it best; with ``extractor_lesson`` ``key`` half of them add: a key's lesson is
    learnt by heart); 0: the extractor is not warm-started"""
    extractor_merges: int = bounded(0, ge=0, le=4096)
    """merge-pass samples beside ``extractor_samples`` (``extractor_lesson`` ``key`` only): the
    manager's merge prompt over a chunk of lessons ordered by title, taught to fold the lessons
    under one key's title into the key's lesson and to leave chunks whose titles differ alone
    (``crl_harness.warmstart.merges``); what ``experience.merge_every`` needs. 0 (the default):
    none, the shipped adapters' recipe"""
    epochs: int = bounded(2, ge=1)
    extractor_epochs: Optional[int] = bounded(None, ge=1)  # noqa: UP045 (OmegaConf reads typing.Optional)
    """the extractor's epochs; null: ``epochs`` (its samples are many and alike: one pass
    may do where the actor's few episodes need several)"""
    extractor_init_from: Optional[str] = None  # noqa: UP045 (OmegaConf reads typing.Optional)
    """an extractor adapter folder (a warm start's ``OUT/extractor``) whose adapters the
    extractor's fit continues instead of fresh ones: more samples or epochs on top of a warm
    start already made, without fitting it again from the start (move ``seed_offset`` for
    levels it has not seen); null (the default): fresh adapters of ``lora``'s shape"""
    batch_size: int = bounded(8, ge=1)
    """samples per optimiser step"""
    lr: float = bounded(1.0e-3, gt=0, le=1)
    dtype: str = choice("float32", "bfloat16", "auto", BF16_IF_NATIVE)
    """the base model's weights while the adapters (fp32, with their AdamW state) are fitted:
    bfloat16 halves the fit's time on a CPU with AVX512-BF16 (the dtype the RL configs sample in;
    bfloat16-if-native: bfloat16 there and on CUDA, float32 elsewhere)"""
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

    steps: int = bounded(512, ge=1)
    seed: int = bounded(0, ge=0, lt=2**32)
    """seeds numpy, whose seeds are below 2^32"""
    output_dir: str = "runs/${name}"
    """metrics, plots and checkpoints go here"""
    checkpoint_every: int = bounded(10, ge=1)
    """steps between atomic checkpoints (the last step is always saved)"""
    keep_checkpoints: int = bounded(2, ge=1)
    """older checkpoints are deleted"""
    backend: str = choice("local", "ray")
    """where the trainer's parts run (its ``Placement``): ``local``, in its own process; ``ray``,
    rollout workers and the Experience Manager as Ray actors"""
    rollout_workers: int = bounded(1, ge=1)
    """parallel rollout workers (env stepping; generation is batched per worker)"""
    torch_threads: int = bounded(0, ge=0, le=1_024, why="0: torch's default")
    """threads for torch in the trainer process (0: torch's default)"""
    tensorboard: bool = True


@dataclass
class TrainConfig:
    """A whole training run; ``arm`` picks co-evolution, a static extractor or no experience."""

    name: str = "run"
    arm: str = choice("co-evolve", "static", "none")
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

    def exact_key_envs(self) -> tuple[str, ...]:
        """The mixture's envs whose retrieval key names the level exactly
        (``crl_envs.exact_retrieval_key``): ``experience.min_query_coverage: null`` floors
        retrieval at their key."""
        import crl_envs

        return tuple(e.id for e in self.tasks.envs if e.id in crl_envs.env_ids()
                     and crl_envs.exact_retrieval_key(e.id))

    def starting_model(self, role: str = "actor") -> str:
        """The model a run's ``role`` (``actor`` or ``extractor``) starts from, as a backend
        spec: the adapters its LoRA training continues (``hf:`` + ``lora.init_from``) when set,
        else its ``model`` (the extractor's ``same``: the actor's); what "before training" means
        in ``crl demo`` and the benchmarks.

        >>> from crl_harness.config import load_config
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

        >>> from crl_harness.config import load_config
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

        >>> from crl_harness.config import load_config
        >>> cfg = load_config(None, ["actor.warmup_steps=3", "experience.retrieval_warmup_steps=1"])
        >>> cfg.actor_warmup, cfg.retrieval_warmup
        (3, 1)
        >>> load_config(None, ["arm=none", "actor.warmup_steps=3"]).actor_warmup
        0
        """
        return 0 if self.arm == "none" else self.actor.warmup_steps


def updated_lesson_steps(cfg: TrainConfig) -> int:
    """The steps of a run that can retrieve lessons written after the extractor's first update,
    at the earliest (0: training the extractor cannot reach the actor before the run ends).

    Entries are first retrieved, and their writers credited, in step ``retrieval_warmup + 1`` (a
    fresh bank without ``experience.initial_bank`` fills in step 1 first); a step credits at
    most ``groups_per_step * guided_per_group * k`` generations, so ``train_after`` of them are
    waiting by step ``u``; the distillations of step ``u + 1`` use the update, and what they
    write is retrieved from step ``u + 2`` on. (Malformed answers with ``extractor.format_penalty``
    wait from their distillation on, which can only make ``u`` earlier.)

    >>> from crl_harness.config import load_config
    >>> updated_lesson_steps(load_config("cpu-demo"))
    5
    """
    t = cfg.tasks
    first = cfg.retrieval_warmup + 1
    if cfg.experience.initial_bank is None:
        first = max(first, 2)
    per_step = t.groups_per_step * t.guided_per_group * cfg.experience.k
    update = first + math.ceil(cfg.extractor.train_after / per_step) - 1
    return max(cfg.run.steps - (update + 2) + 1, 0)
