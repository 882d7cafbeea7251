"""``run_warmstart``: supervised fine-tuning of the actor and the extractor on oracle data.

The recipe (``WarmStartConfig``): oracle episodes on the config's envs, seeds from
``warmstart.seed_offset`` (disjoint from training and held-out), rendered by the rollout
engine's own ``LiveEpisode``; each episode is one packed sequence when its prompts only grow.
LoRA adapters on every linear layer are trained with ``sft_loss`` (token-mean NLL of the
replies) through the same ``PolicyLearner`` that runs GRPO and CISPO, then written atomically
(a temporary directory renamed into place) as ``OUT/actor`` and ``OUT/extractor``; ``hf:OUT/actor``
loads the base model with the adapter merged. ``OUT/metrics.json`` records the command's
settings, data counts, losses and times. ``only`` trains one of the two and leaves the other's
adapter and metrics as they are (``crl warmstart CONFIG --only extractor``).

The extractor's samples are their own episodes (``extractor_episodes``): as many answering
add, return, upvote and downvote, so that no answer is the safe guess.

Why LoRA: the adapters are a few MB (they can be kept beside the command that made them), an
update leaves the base weights intact, and with rank 8-16 on all linear layers SmolLM2-135M
learns the answer format and the oracle's moves within minutes on a CPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from crl_envs.errors import UserFacingError
from crl_harness.config import TrainConfig, config_to_dict
from crl_harness.experience.manager_config import ManagerConfig
from crl_harness.experience.operations import ParseLimits
from crl_harness.models.model_card import write_adapter_card
from crl_harness.models.names import upstream_id
from crl_harness.models.registry import load_backend
from crl_harness.rollout import Turn
from crl_harness.training.learner import PolicyLearner, TrainingRow
from crl_harness.training.losses import sft_loss
from crl_harness.training.packing import pack_turns
from crl_harness.warmstart.data import (
    AdvisedEpisode,
    actor_episodes,
    answer_class,
    extractor_episodes,
    extractor_sample,
)
from crl_harness.warmstart.merges import MergeCase, merge_cases, merge_sample
from crl_harness.warmstart.quotas import class_quotas
from crl_harness.warmstart.reasons import REASONS

__all__ = ["WarmStartError", "run_warmstart", "fit", "save_adapter", "sample_rows", "PARTS"]

PARTS = ("actor", "extractor")
"""what ``run_warmstart(only=...)`` can train alone"""


class WarmStartError(UserFacingError):
    """The warm start cannot run as configured; the message says what to change."""


def sample_rows(turns: list[Turn]) -> list[TrainingRow]:
    """The supervised rows of one episode: one packed row when its prompts only grow, else one
    row per turn; each target token weighs 1 (``fit`` turns the weights into a token mean)."""
    return [TrainingRow(r.prompt_ids, r.completion_ids, r.old_logprobs, 1.0, 1.0,
                        r.completion_mask) for r in pack_turns(turns)]


def fit(model: Any, rows: list[TrainingRow], *, lr: float, epochs: int, batch_size: int,
        lora: Any, seed: int, log: Callable[[str], None] = print,
        label: str = "") -> tuple[PolicyLearner, list[float]]:
    """Train LoRA adapters on ``rows`` with ``sft_loss``; returns the learner and the loss
    (mean NLL per target token) of every optimiser step."""
    learner = PolicyLearner(model, lr=lr, max_grad_norm=1.0, temperature=1.0, micro_batch_size=2,
                            lora=lora, recompute_old_logprobs=True)
    rng = random.Random(seed)
    losses: list[float] = []
    steps = epochs * -(-len(rows) // batch_size)
    for epoch in range(epochs):
        order = rows[:]
        rng.shuffle(order)
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            targets = sum(r.trained_tokens for r in batch)
            weighted = [dataclasses.replace(r, token_weight=1.0 / targets) for r in batch]
            stats = learner.update(weighted, sft_loss)
            losses.append(stats.loss)
            log(f"warmstart {label} epoch {epoch + 1}/{epochs} step {len(losses)}/{steps}: "
                f"loss {stats.loss:.4f} ({targets} target tokens)")
    return learner, losses


ADAPTER_FILES = frozenset({"adapter_config.json", "adapter_model.safetensors", "README.md"})
"""what ``save_adapter`` writes into an adapter folder (peft's layout)"""


def check_reply_lengths(turns: list[Turn], max_new_tokens: int, role: str) -> None:
    """Refuse targets longer than ``ROLE.max_new_tokens``: the model would be taught replies that
    generation cuts off, every one a format failure."""
    longest = max((len(t.token_ids) for t in turns), default=0)
    if longest > max_new_tokens:
        raise WarmStartError(f"a warm-start {role} reply is {longest} tokens but "
                             f"{role}.max_new_tokens is {max_new_tokens}; raise "
                             f"{role}.max_new_tokens to at least {longest}")


def check_replaceable(path: Path) -> None:
    """Raise ``WarmStartError`` unless writing ``path`` loses nothing: it does not exist, or is
    what a warm start wrote there (an adapter folder of ``ADAPTER_FILES`` only, an empty folder,
    its ``metrics.json``). ``warmstart.output_dir`` may be any folder (``.``, ``~/models``)."""
    if not path.exists() and not path.is_symlink():
        return
    if path.name == "metrics.json":
        ours = _read_metrics(path) is not None
    else:
        names = {p.name for p in path.iterdir()} if path.is_dir() and not path.is_symlink() \
            else None
        ours = names is not None and names <= ADAPTER_FILES \
            and (not names or "adapter_config.json" in names)
    if not ours:
        raise WarmStartError(f"{path} exists and is not what a warm start writes there; the warm "
                             "start would replace it: move it, or set warmstart.output_dir to "
                             "another folder.")


def save_adapter(learner: PolicyLearner, directory: Path, base: str, *, trained_on: str,
                 command: str) -> Path:
    """Write the learner's LoRA adapters (fp16, peft layout) and their model card
    (``trained_on``, ``command``: ``write_adapter_card``) to ``directory`` atomically: a killed
    run leaves the previous adapter or the new one, never half of one. What is there must be an
    adapter (``check_replaceable``)."""
    from safetensors.torch import save_file

    check_replaceable(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        learner.model.save_pretrained(staging, save_embedding_layers=False)  # no hub lookup
        state = {k: v.to(torch.float16).contiguous()
                 for k, v in learner.trainable_state_dict().items()}
        save_file(state, str(staging / "adapter_model.safetensors"))
        config_path = staging / "adapter_config.json"
        config = json.loads(config_path.read_text())
        # The base as the config names it, an embedded model by its hub id (the cache path peft
        # records would resolve on no other machine; crl maps the hub id back to its copy).
        config["base_model_name_or_path"] = upstream_id(base.removeprefix("hf:"))
        config_path.write_text(json.dumps(config, indent=2))
        write_adapter_card(staging, trained_on=trained_on, command=command)
        # mkdtemp and safetensors make the folder 0700 and files 0600; an adapter is for every
        # user of the checkout, as the files around it (the umask's modes)
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)
        for path in staging.iterdir():
            path.chmod(0o666 & ~umask)
        if directory.exists():
            # The old adapter goes to a fresh name (a fixed one could be someone's folder).
            old = tempfile.mkdtemp(prefix=f".{directory.name}-old-", dir=directory.parent)
            os.replace(directory, old)  # onto the empty folder: one rename
            os.replace(staging, directory)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory


def _read_metrics(path: Path) -> dict[str, Any] | None:
    """The ``metrics.json`` a warm start wrote at ``path``, or None (absent, or not ours)."""
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and ("actor_losses" in data or "extractor_losses" in data):
        return data
    return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def run_warmstart(cfg: TrainConfig, log: Callable[[str], None] = print,
                  only: str | None = None) -> dict[str, Any]:
    """Generate the oracle data of ``cfg``'s envs, fit the actor's and the extractor's adapters
    (``only``: one of ``PARTS``; the other's adapter and metrics stay as they are), write them
    and ``metrics.json`` under ``cfg.warmstart.output_dir``."""
    w = cfg.warmstart
    if only is not None and only not in PARTS:
        raise WarmStartError(f"only must be one of {', '.join(PARTS)} (or none: both), "
                             f"got {only!r}")
    unsupported = [e.id for e in cfg.tasks.envs if e.id not in REASONS]
    if unsupported:
        raise WarmStartError(
            f"warm start needs oracle actions with reasons an observation can honestly give; "
            f"{', '.join(unsupported)} has none (its oracle applies the episode's solution, which "
            f"no observation explains): remove it from tasks.envs. Supported: "
            f"{', '.join(REASONS)}.")
    extractor_ready = bool(w.extractor_samples and cfg.uses_experience)
    if only == "extractor" and not extractor_ready:
        raise WarmStartError("--only extractor: this config warm-starts no extractor; set "
                             "warmstart.extractor_samples >= 1 (e.g. 64) and an arm that uses "
                             "experience (co-evolve or static)")
    writes_actor = only in (None, "actor")
    writes_extractor = extractor_ready and only in (None, "extractor")
    if w.extractor_init_from is not None and not writes_extractor:
        raise WarmStartError("warmstart.extractor_init_from is set but this warm start fits no "
                             "extractor (" + ("--only actor" if only == "actor" else
                                              "an arm without experience") +
                             "); leave it null, or warm-start the extractor")
    out = Path(w.output_dir)
    parts = [name for name, writes in (("actor", writes_actor), ("extractor", writes_extractor))
             if writes]
    for name in (*parts, "metrics.json"):
        check_replaceable(out / name)  # before anything loads or trains
    out.mkdir(parents=True, exist_ok=True)
    if cfg.run.torch_threads:
        torch.set_num_threads(cfg.run.torch_threads)
    t0 = time.perf_counter()
    settings = config_to_dict(cfg)["warmstart"]
    metrics: dict[str, Any] = {}
    if only:
        # A part trained alone keeps the other's record (counts, losses, and the settings it
        # was made with when they differ from this command's).
        metrics = _read_metrics(out / "metrics.json") or {}
        other = next(name for name in PARTS if name != only)
        if metrics.get("config", settings) != settings:
            metrics.setdefault(f"{other}_config", metrics["config"])
        metrics.pop(f"{only}_config", None)  # the part made now is made with ``config``
    metrics.update({"config": settings, "model": w.model, "seed": cfg.run.seed,
                    "envs": [e.id for e in cfg.tasks.envs], "parts": parts})
    # Each part seeds its own generators: trained alone, it comes out as in a run of both.
    if writes_actor:
        torch.manual_seed(cfg.run.seed)
        metrics.update(_warm_actor(cfg, out, random.Random(cfg.run.seed), log))
    if writes_extractor:
        torch.manual_seed(cfg.run.seed)
        metrics.update(_warm_extractor(cfg, out, random.Random(cfg.run.seed), log))
    metrics["total_seconds"] = time.perf_counter() - t0
    check_replaceable(out / "metrics.json")
    _write_json(out / "metrics.json", metrics)
    log(f"warmstart: done in {metrics['total_seconds']:.0f} s; {' and '.join(parts)} adapters "
        f"in {out} (" + ", ".join(f"{name}.model=hf:{out / name}" for name in parts) + ")")
    return metrics


def _warm_actor(cfg: TrainConfig, out: Path, rng: random.Random,
                log: Callable[[str], None]) -> dict[str, Any]:
    """Oracle episodes for the actor, its fit and ``OUT/actor``; returns its metrics."""
    w = cfg.warmstart
    t0 = time.perf_counter()
    actor_backend = load_backend(w.model, dtype=w.dtype, kv_reuse=False)
    tokenizer = actor_backend.tokenizer
    episodes: list[AdvisedEpisode] = []
    seeds = list(range(w.seed_offset, w.seed_offset + w.episodes))
    for entry in cfg.tasks.envs:
        episodes += actor_episodes(
            entry.id, seeds, noise=w.noise, experience_fraction=w.experience_fraction, rng=rng,
            lesson_fraction=w.lesson_fraction, tokenizer=tokenizer,
            max_context=actor_backend.max_context, max_new_tokens=cfg.actor.max_new_tokens,
            history=cfg.actor.history,
            env_kwargs=entry.kwargs, options=entry.options or None)
    check_reply_lengths([t for e in episodes for t in e.trajectory.turns],
                        cfg.actor.max_new_tokens, "actor")
    rows = [row for e in episodes for row in sample_rows(e.trajectory.turns)]
    if not rows:
        raise WarmStartError("the oracle episodes gave no samples (every episode ended at reset); "
                             "check tasks.envs and warmstart.episodes")
    data_time = time.perf_counter() - t0
    won = sum(e.trajectory.won for e in episodes)
    lessons = sum(e.lesson for e in episodes)
    log(f"warmstart: {len(episodes)} oracle episodes ({won} won, "
        f"{sum(e.advice is not None for e in episodes)} with advice, {lessons} of them a "
        f"transferable lesson), {len(rows)} actor rows, "
        f"{sum(r.trained_tokens for r in rows)} target tokens, in {data_time:.0f} s")

    t1 = time.perf_counter()
    learner, actor_losses = fit(actor_backend.model, rows, lr=w.lr, epochs=w.epochs,
                                batch_size=w.batch_size, lora=w.lora, seed=cfg.run.seed, log=log,
                                label="actor")
    save_adapter(learner, out / "actor", w.model, command=f"crl warmstart {cfg.name}",
                 trained_on=f"the actor's replies in {len(episodes)} scripted-oracle episodes "
                            f"({won} won) of {', '.join(e.id for e in cfg.tasks.envs)}, "
                            "supervised (crl-gym's warm start)")
    return {"episodes": len(episodes), "episodes_won": won,
            "episodes_with_advice": sum(e.advice is not None for e in episodes),
            "episodes_with_lesson": lessons,
            "actor_rows": len(rows), "actor_target_tokens": sum(r.trained_tokens for r in rows),
            "actor_loss_first": actor_losses[0], "actor_loss_last": actor_losses[-1],
            "actor_losses": actor_losses, "data_seconds": data_time,
            "actor_seconds": time.perf_counter() - t1}


def _warm_extractor(cfg: TrainConfig, out: Path, rng: random.Random,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """Balanced extractor episodes (``extractor_episodes``) on each env, their distillation
    samples, the fit and ``OUT/extractor``; returns its metrics."""
    w = cfg.warmstart
    t0 = time.perf_counter()
    backend = load_backend(w.model, dtype=w.dtype, kv_reuse=False)
    envs = cfg.tasks.envs
    episodes: list[AdvisedEpisode] = []
    for index, entry in enumerate(envs):
        # the samples shared over the envs; each env's own share balanced over the classes
        count = w.extractor_samples // len(envs) + (index < w.extractor_samples % len(envs))
        found = extractor_episodes(
            entry.id, list(w.seeds()), count, noise=w.noise, rng=rng,
            lesson=w.extractor_lesson, tokenizer=backend.tokenizer, max_context=backend.max_context,
            max_new_tokens=cfg.actor.max_new_tokens, history=cfg.actor.history,
            env_kwargs=entry.kwargs, options=entry.options or None)
        quotas = class_quotas(count, w.extractor_lesson)
        classes = {name: 0 for name in quotas}
        for episode in found:
            classes[answer_class(episode)] += 1
        short = {name: (classes[name], want) for name, want in quotas.items()
                 if classes[name] < want}
        if short:
            missing = ", ".join(f"{name} {have} of {want}" for name, (have, want) in short.items())
            raise WarmStartError(
                f"the oracle's episodes on {entry.id} gave too few extractor samples of a class "
                f"({missing}) in {len(w.seeds())} levels; lower warmstart.extractor_samples, or "
                "give the episodes a chance to lose or win (warmstart.noise, the env's "
                "max_episode_steps)")
        episodes += found
    merges: list[MergeCase] = []
    for index, entry in enumerate(envs):
        count = w.extractor_merges // len(envs) + (index < w.extractor_merges % len(envs))
        if count:
            try:
                merges += merge_cases(entry.id, w.seeds(), count, rng=rng,
                                      chunk=ManagerConfig().merge_chunk, env_kwargs=entry.kwargs,
                                      options=entry.options or None)
            except ValueError as err:
                raise WarmStartError(f"warmstart.extractor_merges: {err}") from None
    samples = [extractor_sample(e, tokenizer=backend.tokenizer, max_ops=ParseLimits().max_ops,
                                max_transcript_chars=cfg.experience.max_transcript_chars)
               for e in episodes] + [merge_sample(c, tokenizer=backend.tokenizer) for c in merges]
    check_reply_lengths(samples, cfg.extractor.max_new_tokens, "extractor")
    counts = {name: sum(answer_class(e) == name for e in episodes) for name in class_quotas(0)}
    counts.update({"merge": sum(c.lesson is not None for c in merges),
                   "merge return": sum(c.lesson is None for c in merges)} if merges else {})
    rows = [row for s in samples for row in sample_rows([s])]
    data_time = time.perf_counter() - t0
    log(f"warmstart: {len(rows)} extractor samples ("
        + ", ".join(f"{n} {name}" for name, n in counts.items()) + f") in {data_time:.0f} s")
    t1 = time.perf_counter()
    epochs = w.epochs if w.extractor_epochs is None else w.extractor_epochs
    lora = w.lora if w.extractor_init_from is None \
        else dataclasses.replace(w.lora, init_from=w.extractor_init_from)
    learner, losses = fit(backend.model, rows, lr=w.lr, epochs=epochs, batch_size=w.batch_size,
                          lora=lora, seed=cfg.run.seed, log=log, label="extractor")
    continued = "" if w.extractor_init_from is None \
        else f", continuing the adapters of {w.extractor_init_from}"
    save_adapter(learner, out / "extractor", w.model, command=f"crl warmstart {cfg.name}",
                 trained_on=f"{len(rows)} experience-extractor answers to oracle episodes of "
                            f"{', '.join(e.id for e in envs)}, supervised (crl-gym's warm "
                            f"start){continued}")
    return {"extractor_rows": len(rows), "extractor_classes": counts,
            "extractor_prompt_tokens": sum(len(s.prompt_token_ids) for s in samples),
            "extractor_loss_first": losses[0], "extractor_loss_last": losses[-1],
            "extractor_losses": losses, "extractor_data_seconds": data_time,
            "extractor_seconds": time.perf_counter() - t1}
