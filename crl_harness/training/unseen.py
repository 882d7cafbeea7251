"""Test-time experience on unseen levels (M-c): does an agent's own experience of a level it has
never trained on make its next attempt there better?

Holds ``UNSEEN_OFFSET``, ``unseen_levels``, ``key_rounds`` and ``test_time_experience``.
Attempt 1: the actor (frozen) plays each unseen level ``attempts`` times, sampled at its training
temperature, and the extractor distils them into a fresh bank as training does
(``episodes_to_distill``: a level's shortest win; a level never won gets no lesson). Attempt 2:
one greedy episode a level with that bank (guided: its own level's lesson, where attempt 1 wrote
one) and one without (free), paired level by level. Held-out success without a bank stays the
guard for what reached the weights; this measures what the experience adds where training never
went.

Levels that share a retrieval key (in a dark room, the start cell when nothing is in view) are
played in separate rounds, each with a bank of its own: one bank holding two levels of a key
would hand one of them the other's route, and a route does not transfer, so the measure would
count a retrieval miss as the experience's failure.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

__all__ = ["UNSEEN_OFFSET", "ROUNDS", "unseen_levels", "key_rounds", "test_time_experience"]

UNSEEN_OFFSET = 20_000_000
"""Unseen levels start here: apart from the training pools, the warm start's levels (10,000,000
on) and the held-out levels (50,000,000 on)."""

ROUNDS = 3
"""the ``per_key`` that M-c's callers (``crl demo``, ``test_time_check.py``) pass to
``unseen_levels``: 64 dark-room levels keep 48 dark starts (75%, against 78% unfiltered) in three
rounds (six unfiltered, each a run of its own)"""

MAX_SCANNED = 64
"""``unseen_levels`` looks at no more than this many levels per level it returns"""


def retrieval_keys(cfg: Any, seeds: list[int]) -> dict[int, str]:
    """Each seed's retrieval key (``info["retrieval_query"]``; the task when the env has none)
    on ``cfg``'s first env."""
    import gymnasium as gym

    import crl_envs  # noqa: F401  (registers the CRL ids)

    entry = cfg.tasks.envs[0]
    env = gym.make(entry.id, **entry.kwargs)
    try:
        keys = {}
        for seed in seeds:
            info = env.reset(seed=seed, options=dict(entry.options) or None)[1]
            keys[seed] = str(info.get("retrieval_query") or info.get("task") or "")
        return keys
    finally:
        env.close()


def unseen_levels(count: int, offset: int = UNSEEN_OFFSET, *, cfg: Any = None,
                  per_key: int | None = None) -> list[int]:
    """``count`` unseen level seeds from ``offset`` on. With ``cfg`` and ``per_key``, a level is
    skipped when ``per_key`` earlier ones share its retrieval key (``cfg``'s first env): the
    levels stay in their natural mix (most dark starts) while ``test_time_experience`` needs no
    more than ``per_key`` rounds."""
    if per_key is None:
        return list(range(offset, offset + count))
    if cfg is None or per_key < 1:
        raise ValueError(f"unseen_levels: per_key needs a config and per_key >= 1, got "
                         f"{per_key}.")
    chosen: list[int] = []
    seen: Counter[str] = Counter()
    start = offset
    while len(chosen) < count:
        if start - offset >= MAX_SCANNED * count:
            raise ValueError(f"unseen_levels: only {len(chosen)} levels with at most {per_key} "
                             f"a retrieval key in {start - offset} levels; ask for fewer.")
        for seed, key in retrieval_keys(cfg, list(range(start, start + count))).items():
            if seen[key] < per_key and len(chosen) < count:
                seen[key] += 1
                chosen.append(seed)
        start += count
    return chosen


def key_rounds(keys: dict[int, str]) -> list[list[int]]:
    """The seeds of ``keys`` (seed: retrieval key) in rounds whose keys differ: the n-th level of
    a key plays in round n.

    Example:
        >>> key_rounds({1: "a", 2: "b", 3: "a", 4: "a"})
        [[1, 2], [3], [4]]
    """
    rounds: list[list[int]] = []
    seen: Counter[str] = Counter()
    for seed, key in keys.items():
        if seen[key] == len(rounds):
            rounds.append([])
        rounds[seen[key]].append(seed)
        seen[key] += 1
    return rounds


def test_time_experience(cfg: Any, *, actor: str, extractor: str, seeds: list[int], out: Path,
                         attempts: int = 4, dtype: str = "auto") -> dict[str, dict[int, bool]]:
    """Attempt 1 of ``actor`` (an adapter folder or model, ``hf:`` spec) on ``seeds`` of
    ``cfg``'s first env, distilled by ``extractor`` (an ``hf:`` adapter folder or model) into a
    fresh bank; attempt 2 greedy with that bank (``guided``) and without it (``free``). Levels
    that share a retrieval key play in separate rounds (``key_rounds``), round N under
    ``out/round-N/attempt-1`` (its run and bank) and ``out/round-N/attempt-2``. Returns the two
    cases' outcomes by seed (``heldout.paired(free, guided)`` is the difference)."""
    if attempts < 2:
        raise ValueError(f"test-time experience needs attempts >= 2, got {attempts}.")
    outcomes: dict[str, dict[int, bool]] = {"guided": {}, "free": {}}
    for number, round_seeds in enumerate(key_rounds(retrieval_keys(cfg, list(seeds))), start=1):
        played = _one_round(cfg, actor, extractor, round_seeds, Path(out) / f"round-{number}",
                            attempts, dtype)
        for case, by_seed in played.items():
            outcomes[case].update(by_seed)
    return outcomes


def _one_round(cfg: Any, actor: str, extractor: str, seeds: list[int], out: Path, attempts: int,
               dtype: str) -> dict[str, dict[int, bool]]:
    """Attempts 1 and 2 on ``seeds``, whose retrieval keys differ."""
    import yaml

    from crl_harness.config import config_to_dict, load_config
    from crl_harness.eval.heldout import evaluate_levels
    from crl_harness.training.trainer import Trainer

    run_dir = out / "attempt-1"
    base_actor, actor_lora = _base_and_adapter(actor, cfg.actor.model)
    base_extractor, extractor_lora = _base_and_adapter(extractor, cfg.extractor.model)
    settings = config_to_dict(cfg)
    settings.update(arm="static")
    settings["run"].update(steps=1, checkpoint_every=1, tensorboard=False,
                           output_dir=str(run_dir))
    settings["tasks"].update(schedule="revisit", groups_per_step=len(seeds), seeds=list(seeds),
                             group_size=attempts, guided_per_group=attempts // 2)
    settings["experience"].update(retrieval_warmup_steps=1, initial_bank=None)
    settings["actor"].update(model=base_actor, warmup_steps=1, dtype=dtype)
    settings["actor"]["lora"].update(init_from=actor_lora)
    settings["extractor"].update(model=base_extractor, dtype=dtype)
    settings["extractor"]["lora"].update(init_from=extractor_lora)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "attempt-1.yaml"
    path.write_text(yaml.safe_dump(settings))
    first = load_config(path)
    Trainer(first, overwrite=True).train()
    return evaluate_levels(first, actor, {"guided": (seeds, True), "free": (seeds, False)},
                           out / "attempt-2", bank=run_dir / "bank.sqlite", dtype=dtype)


def _base_and_adapter(spec: str, configured: str) -> tuple[str, str | None]:
    """The base model and the adapter folder of ``spec``: a folder with
    ``adapter_config.json`` is LoRA adapters on ``configured`` (the config's model, their base);
    anything else is a whole model."""
    path = Path(spec.removeprefix("hf:"))
    if (path / "adapter_config.json").is_file():
        return configured, str(path)
    return spec, None
