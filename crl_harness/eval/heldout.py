"""Level-by-level evaluation of an actor, for paired comparisons (``crl demo``,
``benchmarks/efficacy.py``).

Holds ``evaluate_levels`` (greedy, one episode per level, several cases played as one batch with
one model load, each case on one env of the config's mixture; each case's outcomes by level, and
a report of its episodes), ``env_cases`` (cases on every env of a mixture), ``paired`` (two
cases' outcomes on their common levels as a ``PairedDifference``), ``pooled`` (several envs'
paired differences as one), ``model_hash`` and ``default_cache``.

The outcomes of a model that does not change (the warm start) are cached: the key is the hash of
the model's files (an adapter's weights and config), the env and its kwargs, the seeds and the
generation settings, so the "before" of a second run is free, and any change to the adapter
plays it again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from crl_harness.eval.intervals import PairedDifference, paired_difference

__all__ = ["evaluate_levels", "lesson_free_twins", "replay_handed", "handed_lessons",
           "handed_line", "load_actor", "env_cases", "paired", "pooled", "model_hash",
           "default_cache"]

_CACHE_FORMAT = 4  # bump when what a cached outcome means changes (2: the dtype in the key;
# 3: a bf16 adapter keeps fp32 rotary frequencies, so its greedy outcomes may differ; 4: a
# prompt continues the ids of the last prompt and reply instead of re-tokenising them)


def default_cache() -> Path:
    """Where cached outcomes live: ``CRL_CACHE_DIR`` (default ``~/.cache/crl``) ``/heldout``."""
    from crl_envs.data import cache_dir

    return cache_dir() / "heldout"


def model_hash(spec: str) -> str | None:
    """SHA-256 over the files of an ``hf:`` model that is a local folder (their relative paths
    and bytes; READMEs aside); None for anything else (a hub id may change under its name).

    >>> import tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "adapter_model.safetensors").write_bytes(b"w1")
    >>> first = model_hash(f"hf:{folder}")
    >>> _ = (folder / "adapter_model.safetensors").write_bytes(b"w2")
    >>> first != model_hash(f"hf:{folder}"), model_hash("hf:no/such-model")
    (True, None)
    """
    if not spec.startswith("hf:"):
        return None
    from crl_harness.models.names import resolve_model_path

    try:
        folder = Path(resolve_model_path(spec.removeprefix("hf:")))
    except Exception:  # noqa: BLE001 - no such model: nothing to cache (loading it says why)
        return None
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.name.lower().startswith("readme"):
            continue
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def paired(a: dict[int, bool], b: dict[int, bool]) -> PairedDifference:
    """B minus A on the levels both played (an episode the env failed is no level of either)."""
    levels = sorted(a.keys() & b.keys())
    return paired_difference([a[s] for s in levels], [b[s] for s in levels])


def pooled(differences: list[PairedDifference]) -> PairedDifference:
    """The paired differences of several envs as one: their pairs counted together.

    >>> d = PairedDifference(n=10, a_wins=3, b_wins=5, only_a=1, only_b=3)
    >>> pooled([d, d]) == PairedDifference(n=20, a_wins=6, b_wins=10, only_a=2, only_b=6)
    True
    """
    return PairedDifference(*(sum(getattr(d, f) for d in differences)
                              for f in ("n", "a_wins", "b_wins", "only_a", "only_b")))


def env_cases(cfg: Any, cases: dict[str, tuple[list[int], bool]]
              ) -> dict[str, tuple[list[int], bool, int]]:
    """``cases`` (name: seeds, whether they retrieve) on every env of ``cfg``'s mixture, as
    ``evaluate_levels`` takes them: one env keeps the names; several get one case per env and
    name, ``NAME/ENV`` (``ENV``: ``short_env_name``).

    >>> from crl_harness.config import load_config
    >>> sorted(env_cases(load_config("mix3"), {"held-out": ([7], False)}))
    ['held-out/ALFWorld', 'held-out/MiniHackRoom', 'held-out/WebShop']
    >>> env_cases(load_config("cpu-demo"), {"held-out": ([7], False)})
    {'held-out': ([7], False, 0)}
    """
    from crl_harness.training.metrics import short_env_name

    envs = cfg.tasks.envs
    if len(envs) == 1:
        return {name: (seeds, with_bank, 0) for name, (seeds, with_bank) in cases.items()}
    return {f"{name}/{short_env_name(entry.id)}": (seeds, with_bank, index)
            for name, (seeds, with_bank) in cases.items() for index, entry in enumerate(envs)}


def cache_file(cache: Path, fingerprint: str, entry: Any, seeds: list[int], rollout: Any,
               dtype: str, engine: str = "hf") -> Path:
    """Where the outcomes of a model (``fingerprint``, ``model_hash``) on ``seeds`` of the env
    ``entry`` (a ``tasks.envs`` entry) are cached under ``cache``, for those generation settings
    and the engine that played them (``hf``, ``vllm``: their greedy tokens may differ)."""
    key = {"format": _CACHE_FORMAT, "model": fingerprint, "env_id": entry.id,
           "env_kwargs": dict(entry.kwargs), "seeds": seeds,
           "max_new_tokens": rollout.actor.max_new_tokens, "history": rollout.actor.history,
           "dtype": dtype}
    if entry.options:  # reset options choose the levels (a config without keeps its key)
        key["options"] = dict(entry.options)
    if engine != "hf":  # (an hf key stays what it was before engines were chosen)
        key["engine"] = engine
    text = json.dumps(key, sort_keys=True, default=str)
    return cache / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"


def load_actor(cfg: Any, actor: str, dtype: str = "auto", role: str = "actor") -> Any:
    """``actor`` (an ``hf:`` spec: a model or an adapter folder) on the engine that ``cfg``'s
    ``role`` (``actor``, ``extractor``) generates with (``ROLE.rollout_engine``: transformers, or
    vLLM, with the adapter merged in fp32), with that role's KV cache either way."""
    from crl_harness.models.engines import resolve_rollout_engines, sampling_engine

    resolve_rollout_engines(cfg)
    engine = sampling_engine(getattr(cfg, role).rollout_engine)
    return engine.load(engine.spec(actor), dtype=dtype, kv_cache_tokens=cfg.kv_cache_tokens(role),
                       seed=cfg.run.seed)


def evaluate_levels(cfg: Any, actor: str,
                    cases: dict[str, tuple[list[int], bool] | tuple[list[int], bool, int]],
                    out: Path, *, bank: Path | None = None, cache: Path | None = None,
                    dtype: str = "auto", refresh: bool = False) -> dict[str, dict[int, bool]]:
    """Greedy episodes of ``actor`` on the envs of ``cfg`` (a ``TrainConfig``; each env with its
    kwargs and reset options), one per level, for every case (name: its seeds, whether its
    episodes retrieve from ``bank``, and the index of its env in ``cfg.tasks.envs``, 0 when left
    out; ``env_cases`` makes a case of every env): each case's outcome by seed. The cases played
    now are one batch, and each gets a report under ``out/NAME/report.json``; with ``cache`` (a
    folder), the outcomes of a case without the bank are read from it when there, and written to
    it once played (``refresh``: played even when cached, and the cache rewritten). ``dtype``:
    the weights' dtype of an ``hf:`` actor (part of the cache key); it plays on the engine that
    ``cfg`` rolls out with (``load_actor``). A level of a case with the bank whose reset
    retrieves nothing, and that a case without the bank plays now on the same env, is played once
    (``lesson_free_twins``): its outcome and report entry are its twin's, and its report's
    ``meta.twin_seeds`` lists such levels; ``meta.handed_lessons`` (``replay_handed``) the levels
    of a case with the bank that were handed a lesson, and whether it wins replayed."""
    from crl_harness.eval import evaluate, write_report
    from crl_harness.rollout import EpisodeSpec, RolloutConfig

    # greedy, one lesson's effect as it is: no gate, no asks, whatever the run does; 64 levels
    # at once whatever a training step's batch (fewer, longer batches: the held-out set is 96+)
    rollout = RolloutConfig.from_config(cfg, temperature=0.0, actor_critic_gate=False,
                                        search_and_ask=False, max_live=64)
    fingerprint = model_hash(actor) if cache is not None else None
    if actor.startswith("hf:"):
        from crl_harness.models.engines import resolve_rollout_engines

        resolve_rollout_engines(cfg)  # the engine is part of the cache key
    engine = cfg.actor.rollout_engine if actor.startswith("hf:") else "hf"

    outcomes: dict[str, dict[int, bool]] = {}
    to_play = {}
    for name, (seeds, with_bank, *index) in cases.items():
        entry = cfg.tasks.envs[index[0] if index else 0]
        path = None if with_bank or fingerprint is None or cache is None else \
            cache_file(cache, fingerprint, entry, seeds, rollout, dtype, engine)
        if path is not None and path.exists() and not refresh:
            outcomes[name] = {int(s): won for s, won in json.loads(path.read_text()).items()}
        else:
            to_play[name] = (seeds, with_bank, path, index[0] if index else 0)
    if not to_play:
        return outcomes

    manager = None
    if bank is not None and bank.exists() and any(b for _, b, _, _ in to_play.values()):
        from crl_harness.experience import (
            ExperienceBank,
            ExperienceManager,
            ManagerConfig,
        )

        # the run's retrieval (its floor at exact keys, its re-rank), as its rollouts retrieved
        manager = ExperienceManager(ExperienceBank(bank, read_only=True), config=ManagerConfig.from_config(
            cfg.experience, cfg.exact_key_envs(), seed=cfg.run.seed))
    twins = lesson_free_twins(cfg, rollout, bank, to_play) if manager is not None else {}
    specs, case_of = [], []  # an episode's group id is its place here, so cases never mix
    for name, (seeds, with_bank, _, index) in to_play.items():
        entry = cfg.tasks.envs[index]
        for seed in seeds:
            if seed in twins.get(name, {}):
                continue
            specs.append(EpisodeSpec(entry.id, seed, group_id=len(specs),
                                     use_experience=with_bank and manager is not None,
                                     options=dict(entry.options) or None))
            case_of.append(name)
    backend = None
    try:
        if actor.startswith("hf:"):
            backend = load_actor(cfg, actor, dtype)
        trajectories = evaluate(actor, specs, backend=backend, retriever=manager,
                                rollout=rollout)
    finally:
        if backend is not None:
            backend.close()
        if manager is not None:
            manager.close()
            manager.bank.close()  # the manager leaves the bank to whoever opened it
    played_by = {(case_of[t.group_id], t.seed): t for t in trajectories}
    for name, (seeds, with_bank, path, index) in to_play.items():
        from_twin = twins.get(name, {})
        played = [replace(played_by[(from_twin[s], s)], use_experience=True) if s in from_twin
                  else played_by[(name, s)] for s in seeds]
        meta = {"agent": actor, "seeds": seeds, "twin_seeds": sorted(from_twin)}
        if with_bank and manager is not None:  # where the bank acted, and with what
            meta["handed_lessons"] = replay_handed(cfg.tasks.envs[index], played)
        write_report(out / name / "report.json", played, meta=meta)
        outcomes[name] = {t.seed: bool(t.won) for t in played if not t.error}
        if path is not None and len(outcomes[name]) == len(seeds):  # env failures: not kept
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps({str(s): won for s, won in outcomes[name].items()}))
            os.replace(tmp, path)
    return outcomes


def lesson_free_twins(cfg: Any, rollout: Any, bank: Path,
                      cases: dict[str, tuple[list[int], bool, Any, int]]) -> dict[str, dict[int, str]]:
    """For each case with the bank (``cases``: name: seeds, with the bank, cache path, env index),
    its levels whose reset retrieves nothing from ``bank`` and that a case without the bank plays
    on the same env: level -> that case. Such a level's greedy episode sees the prompt its twin
    sees, so ``evaluate_levels`` plays it once (the levels cpu-demo trains on hold the keys of 38
    of its 96 held-out levels, ``benchmarks/key_coverage.py``: the other 58 retrieve nothing).
    Each reset asks a manager of its own: an empty retrieval depends on the bank alone, and the
    manager that plays keeps its random state."""
    from crl_harness.experience import ExperienceBank, ExperienceManager, ManagerConfig
    from crl_harness.rollout.episode import make_env

    free: dict[tuple[int, int], str] = {}
    for name, (seeds, with_bank, _, index) in cases.items():
        if not with_bank:
            free.update({(index, seed): name for seed in seeds if (index, seed) not in free})
    asked = {name: [(s, free[(index, s)]) for s in seeds if (index, s) in free]
             for name, (seeds, with_bank, _, index) in cases.items() if with_bank}
    if not any(asked.values()):
        return {}
    probe = ExperienceManager(ExperienceBank(bank, read_only=True), config=ManagerConfig.from_config(
        cfg.experience, cfg.exact_key_envs(), seed=cfg.run.seed))
    twins: dict[str, dict[int, str]] = {}
    try:
        for name, pairs in asked.items():
            entry = cfg.tasks.envs[cases[name][3]]
            env = make_env(entry.id, probe, rollout.experience.k,
                           **rollout.env_kwargs.get(entry.id, {}))
            try:
                for seed, twin in pairs:
                    _, info = env.reset(seed=seed, options={**dict(entry.options or {}),
                                                            "use_experience": True})
                    if not info.get("experience_ids"):
                        twins.setdefault(name, {})[seed] = twin
            finally:
                env.close()
    finally:
        probe.close()
        probe.bank.close()
    return twins


def replay_handed(entry: Any, played: list[Any]) -> dict[str, bool]:
    """Each level of ``played`` (episodes on ``entry``, a ``tasks.envs`` entry) whose episode was
    handed a lesson that ``LessonReplay`` reads -> whether the lesson wins the level played
    without a model (``LessonReplay.handed_wins``): where a bank acted on the levels, and whether
    what it handed could win them whatever the actor did."""
    from crl_harness.training.lesson_replay import LessonReplay

    replay = LessonReplay({entry.id: dict(entry.kwargs)}, {entry.id: dict(entry.options or {})})
    try:
        won = {str(t.seed): replay.handed_wins(t.env_id, t.seed, t.experience)
               for t in played if t.experience_ids and not t.error}
    finally:
        replay.close()
    return {seed: w for seed, w in won.items() if w is not None}


def handed_lessons(report: Path) -> dict[int, bool]:
    """A case's ``meta.handed_lessons`` (``evaluate_levels``) from its ``report.json``: level ->
    whether the lesson it was handed wins replayed; empty where the report has none."""
    handed = json.loads(report.read_text()).get("meta", {}).get("handed_lessons") or {}
    return {int(seed): bool(won) for seed, won in handed.items()}


def handed_line(handed: dict[Any, bool], without: dict[Any, bool],
                with_bank: dict[Any, bool]) -> str:
    """Where a bank acted on the levels of ``with_bank`` (pairs with ``without``, the same
    actor), said in one line: how many were handed a lesson, how many of those lessons win
    replayed, and the actor's wins on each part with the bank and without it.

    >>> handed_line({1: True, 2: False}, {1: False, 2: True, 3: True}, {1: True, 2: False, 3: True})
    'handed a lesson a replay reads on 2 of 3 levels, 1 of them winning replayed without a model: \
on those 1 the actor won 1 with the bank and 0 without; on the 1 whose lesson loses, 0 with and \
1 without'
    """
    win = [level for level, w in handed.items() if w and level in without]
    lose = [level for level, w in handed.items() if not w and level in without]
    return (f"handed a lesson a replay reads on {len(win) + len(lose)} of {len(with_bank)} levels, "
            f"{len(win)} of them winning replayed without a model: on those {len(win)} the actor won "
            f"{sum(with_bank[s] for s in win)} with the bank and {sum(without[s] for s in win)} "
            f"without; on the {len(lose)} whose lesson loses, {sum(with_bank[s] for s in lose)} "
            f"with and {sum(without[s] for s in lose)} without")
