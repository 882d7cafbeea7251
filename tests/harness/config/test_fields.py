"""Field-declared bounds: each numeric setting carries its bounds beside its default, and the
load-time check reports the first setting outside them with its key and message."""

from __future__ import annotations

import re
import typing
from dataclasses import fields, is_dataclass

import pytest

from crl_harness.config import ConfigError, TrainConfig, load_config
from crl_harness.config.fields import Bounds, bounded

UNBOUNDED = {
    "TaskConfig.guided_per_group": "1..group_size-1 unless arm=none: a cross-field check",
}
"""numeric settings with no bounds of their own, and why"""


def _sections(cls: type = TrainConfig) -> list[type]:
    """``cls`` and every config dataclass under it (nested sections, list items)."""
    found = [cls]
    for hint in typing.get_type_hints(cls).values():
        for part in (hint, *typing.get_args(hint)):
            if is_dataclass(part) and part not in found:
                found += [s for s in _sections(part) if s not in found]
    return found


def _numeric_fields() -> list[tuple[str, object]]:
    numeric = []
    for cls in _sections():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            kinds = set(typing.get_args(hints[f.name]) or (hints[f.name],)) - {type(None)}
            if kinds and kinds <= {int, float}:
                numeric.append((f"{cls.__name__}.{f.name}", f))
    return numeric


def test_every_numeric_setting_declares_bounds_or_is_listed_as_unbounded():
    numeric = _numeric_fields()
    undeclared = {name for name, f in numeric if "bounds" not in f.metadata}
    assert undeclared == set(UNBOUNDED), (
        "a numeric setting without bounded(...): declare its bounds beside its default (config/schema.py, config/learners.py), or list it "
        f"in UNBOUNDED with why; new: {sorted(undeclared - set(UNBOUNDED))}, "
        f"stale: {sorted(set(UNBOUNDED) - undeclared)}")
    assert len(numeric) > 50  # the walk reached every section (LoRA, env entries included)


def test_every_default_lies_within_its_bounds():
    for name, f in _numeric_fields():
        if "bounds" in f.metadata:
            assert f.metadata["bounds"].problem(f.default) is None, name


@pytest.mark.parametrize("override, message", [
    ("run.steps=0", "'run.steps': must be >= 1, got 0"),
    ("actor.top_p=1.5", "'actor.top_p': must be in (0, 1] (1: no nucleus cut), got 1.5"),
    ("extractor.top_p=0", "'extractor.top_p': must be in (0, 1] (1: no nucleus cut), got 0.0"),
    ("actor.warmup_steps=-1",
     "'actor.warmup_steps': must be >= 0 (0: the actor trains from step 1), got -1"),
    ("experience.demotion_prob=1.5", "'experience.demotion_prob': must be in [0, 1], got 1.5"),
    ("warmstart.lr=0", "'warmstart.lr': must be in (0, 1], got 0.0"),
    ("tasks.envs.0.weight=0", "'tasks.envs.0.weight': must be > 0, got 0.0"),
    ("experience.k=101",
     "'experience.k': must be in [1, 100] (each entry goes into the prompt), got 101"),
    ("run.seed=4294967296", "'run.seed': must be in [0, 4294967296), got 4294967296"),
    # LoRAConfig is declared once and reported under each section that holds one
    ("actor.lora.r=0", "'actor.lora.r': must be >= 1, got 0"),
    ("extractor.lora.alpha=0", "'extractor.lora.alpha': must be > 0, got 0"),
    ("warmstart.lora.r=0", "'warmstart.lora.r': must be >= 1, got 0"),
    ("warmstart.lora.dropout=1", "'warmstart.lora.dropout': must be in [0, 1), got 1.0"),
    ("warmstart.lora.top_layers=-1",
     "'warmstart.lora.top_layers': must be >= 0 (0: every layer), got -1"),
    # a setting that may be null is checked when it is not
    ("warmstart.extractor_epochs=0", "'warmstart.extractor_epochs': must be >= 1, got 0"),
    ("extractor.kv_cache_tokens=0", "'extractor.kv_cache_tokens': must be >= 1, got 0"),
])
def test_a_bound_declared_on_a_field_is_enforced_with_its_key_and_message(override, message):
    with pytest.raises(ConfigError, match=re.escape(f"bad config key {message}") + "$"):
        load_config("cpu-demo", [override])


def test_a_null_setting_skips_its_bounds_and_follows_its_fallback():
    cfg = load_config("cpu-demo", ["extractor.kv_cache_tokens=null",
                                   "experience.retrieval_warmup_steps=null",
                                   "warmstart.extractor_epochs=null"])
    assert cfg.kv_cache_tokens("extractor") == cfg.actor.kv_cache_tokens
    # the extractor's null is the actor's cache: a bad one is reported under the actor's key
    with pytest.raises(ConfigError, match="'actor.kv_cache_tokens': must be >= 1, got 0$"):
        load_config("cpu-demo", ["actor.kv_cache_tokens=0", "extractor.kv_cache_tokens=null"])


@pytest.mark.parametrize("overrides, key", [
    (["run.steps=0", "actor.lr=.nan", "arm=both"], "actor.lr"),      # non-finite first
    (["run.steps=0", "arm=both"], "arm"),                              # then choices
    (["experience.candidates=0", "experience.k=2"], "experience.candidates"),
    (["experience.candidates=0", "experience.k=0"], "experience.k"),  # bounds before relations
    (["tasks.group_size=1", "tasks.guided_per_group=4"], "tasks.group_size"),
])
def test_several_problems_report_the_first_in_check_order(overrides, key):
    with pytest.raises(ConfigError, match=f"bad config key '{key}'"):
        load_config("cpu-demo", overrides)


def test_bounds_read_as_a_range():
    assert [str(b) for b in (Bounds(ge=1), Bounds(gt=0), Bounds(lt=5), Bounds(ge=0, le=1),
                             Bounds(gt=0, le=1), Bounds(ge=0, lt=1))] == [
        ">= 1", "> 0", "< 5", "in [0, 1]", "in (0, 1]", "in [0, 1)"]
    assert Bounds(ge=0, le=1).admits(0) and Bounds(ge=0, le=1).admits(1)
    assert not Bounds(gt=0, le=1).admits(0) and not Bounds(ge=0, lt=1).admits(1)
    with pytest.raises(ValueError, match="at least one"):
        bounded(3)


def test_hardening_a_negative_history_is_refused():
    """``actor.history`` keeps the last k turns; a negative k would slice from the front."""
    with pytest.raises(ConfigError, match=r"'actor.history': must be >= 0 \(null: all that fit\), got -2"):
        load_config(None, ["actor.history=-2"])
    assert load_config(None, ["actor.history=0"]).actor.history == 0
