"""Test-time experience on unseen levels (M-c): does an agent's own experience of a level it has
never trained on make its next attempt there better?

Holds ``UNSEEN_OFFSET`` and ``test_time_experience``. Attempt 1: the actor (frozen) plays each
unseen level ``attempts`` times, sampled at its training temperature, and the extractor distils
them into a fresh bank as training does (``episodes_to_distill``: a level's shortest win; a level
never won gets no lesson). Attempt 2: one greedy episode a level with that bank (guided: its own
level's lesson, where attempt 1 wrote one) and one without (free), paired level by level. Held-out
success without a bank stays the guard for what reached the weights; this measures what the
experience adds where training never went.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["UNSEEN_OFFSET", "unseen_levels", "test_time_experience"]

UNSEEN_OFFSET = 20_000_000
"""Unseen levels start here: apart from the training pools, the warm start's levels (10,000,000
on) and the held-out levels (50,000,000 on)."""


def unseen_levels(count: int, offset: int = UNSEEN_OFFSET) -> list[int]:
    """``count`` unseen level seeds."""
    return list(range(offset, offset + count))


def test_time_experience(cfg: Any, *, actor: str, extractor: str, seeds: list[int], out: Path,
                         attempts: int = 4, dtype: str = "auto") -> dict[str, dict[int, bool]]:
    """Attempt 1 of ``actor`` (an adapter folder or model, ``hf:`` spec) on ``seeds`` of
    ``cfg``'s first env, distilled by ``extractor`` (an ``hf:`` adapter folder or model) into a
    fresh bank under ``out/attempt-1``; attempt 2 greedy with that bank (``guided``) and without
    it (``free``). Returns the two cases' outcomes by seed (``heldout.paired(free, guided)`` is
    the difference)."""
    import yaml

    from crl_harness.config import config_to_dict, load_config
    from crl_harness.eval.heldout import evaluate_levels
    from crl_harness.training.trainer import Trainer

    if attempts < 2:
        raise ValueError(f"test-time experience needs attempts >= 2, got {attempts}.")
    run_dir = Path(out) / "attempt-1"
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
    Path(out).mkdir(parents=True, exist_ok=True)
    path = Path(out) / "attempt-1.yaml"
    path.write_text(yaml.safe_dump(settings))
    first = load_config(path)
    Trainer(first, overwrite=True).train()
    return evaluate_levels(first, actor, {"guided": (seeds, True), "free": (seeds, False)},
                           Path(out) / "attempt-2", bank=run_dir / "bank.sqlite", dtype=dtype)


def _base_and_adapter(spec: str, configured: str) -> tuple[str, str | None]:
    """The base model and the adapter folder of ``spec``: a folder with
    ``adapter_config.json`` is LoRA adapters on ``configured`` (the config's model, their base);
    anything else is a whole model."""
    path = Path(spec.removeprefix("hf:"))
    if (path / "adapter_config.json").is_file():
        return configured, str(path)
    return spec, None
