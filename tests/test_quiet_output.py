"""Quiet output: each of our warnings once a process, no third-party warnings or progress bars
that our code triggers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    """This environment with the worktree's code first on the path, without the switches of
    quiet output (an in-process ``crl`` command of another test sets them here)."""
    from crl_harness.quiet import HUB_BARS_VARIABLE, VLLM_LEVEL_VARIABLE

    env = {key: value for key, value in os.environ.items()
           if key not in (HUB_BARS_VARIABLE, VLLM_LEVEL_VARIABLE)}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.parametrize(("preset", "level"), [
    (None, "ERROR"), ("INFO", "INFO"), ("warning", "WARNING"), ("LOUD", "ERROR")])
def test_hardening_quiet_sets_vllms_logger_from_its_variable(monkeypatch, preset, level):
    # a spawned process (efficacy.py's runs) inherits the variable but not the logger's level;
    # a value the user set wins, one logging does not know falls back to errors only
    import logging

    from crl_harness.quiet import HUB_BARS_VARIABLE, VLLM_LEVEL_VARIABLE, quiet_third_party

    logger = logging.getLogger("vllm")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setenv(HUB_BARS_VARIABLE, os.environ.get(HUB_BARS_VARIABLE, "1"))
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"))
    monkeypatch.setenv(VLLM_LEVEL_VARIABLE, preset or "")  # restored after, whatever it was
    if preset is None:
        monkeypatch.delenv(VLLM_LEVEL_VARIABLE)
    quiet_third_party()
    assert logging.getLevelName(logger.level) == level


@pytest.mark.slow
def test_demo_table_is_quiet(tmp_path):
    """No pkg_resources warning from minihack's import; and none of LocalSandbox's about
    untrusted agents (it warns once a process): the table plays the envs' own oracles."""
    run = subprocess.run(
        [sys.executable, "-m", "crl_harness.cli", "demo", "--no-train", "--envs",
         "CRL/MiniHackRoom-v0,CRL/SWEBenchToy-v0", "--episodes", "2", "--out",
         str(tmp_path / "demo")],
        capture_output=True, text=True, cwd=ROOT, env=_env())
    assert run.returncode == 0, run.stderr
    output = run.stdout + run.stderr
    assert "pkg_resources" not in output
    assert "UnisolatedSandboxWarning" not in output


def test_swe_rows_from_parquet_draw_no_progress_bar(tmp_path):
    """swebench reads a .parquet through the datasets library, which draws a "Generating train
    split" bar the first time it caches a file (a fresh cache here, so it would)."""
    pytest.importorskip("swebench", reason="pip install 'crl-gym[swebench]'")
    script = textwrap.dedent(f"""
        import pandas
        import datasets
        from crl_envs.swebench.data import load_instances

        rows = load_instances("toy")
        pandas.DataFrame(rows).to_parquet({str(tmp_path / "rows.parquet")!r})
        assert [r["instance_id"] for r in load_instances({str(tmp_path / "rows.parquet")!r})] \\
            == [rows[0]["instance_id"]]
        assert datasets.is_progress_bar_enabled()  # the user's setting is restored
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                         env=_env(HF_DATASETS_CACHE=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert "Generating" not in run.stdout + run.stderr


def test_unisolated_warning_is_shown_once_a_process(tmp_path):
    from crl_envs.swebench import sandbox
    from crl_envs.swebench.sandbox import local

    local._warn_unisolated.cache_clear()
    with pytest.warns(sandbox.UnisolatedSandboxWarning) as shown:
        boxes = [sandbox.LocalSandbox(tmp_path) for _ in range(3)]
    for box in boxes:
        box.close()
    assert len(shown) == 1
    assert shown[0].filename == __file__  # it names the code that made the sandbox


def _third_party_noise(output: str) -> list[str]:
    """The lines of ``output`` that are a warning or a library's model load bar."""
    return [line for line in output.splitlines()
            if "warn" in line.lower() or "Loading weights" in line]


def test_adapter_save_and_model_load_print_no_warning(tmp_path):
    """An adapter continued from one that names its base by a hub id (the shipped warm starts
    do) is saved without peft asking the hub about that base (offline: "Unable to fetch remote
    file", "Could not find a config file"; online: a config download), and loading a model or
    the saved adapter draws no "Loading weights" bar."""
    pytest.importorskip("peft")
    script = textwrap.dedent(f"""
        import json
        from pathlib import Path

        from crl_harness.config.schema import LoRAConfig
        from crl_harness.models.hf import HFBackend
        from crl_harness.models.tiny import build_tiny_model
        from crl_harness.quiet import quiet_third_party
        from crl_harness.training.learner import PolicyLearner

        quiet_third_party()
        tmp = Path({str(tmp_path)!r})
        model = build_tiny_model(tmp / "tiny")

        def learner(lora):
            backend = HFBackend(model, dtype="float32", device="cpu")
            return backend, PolicyLearner(backend.model, lr=1e-3, max_grad_norm=1.0,
                                          temperature=1.0, micro_batch_size=2, lora=lora)

        _, first = learner(LoRAConfig(enabled=True))
        first.save_adapter(tmp / "warm", "HuggingFaceTB/SmolLM2-135M-Instruct")
        backend, continued = learner(LoRAConfig(enabled=True, init_from=str(tmp / "warm")))
        continued.save_adapter(tmp / "saved", str(model))
        backend.tokenizer.save_pretrained(tmp / "saved")
        assert json.loads((tmp / "saved" / "adapter_config.json").read_text())[
            "base_model_name_or_path"] == str(model)
        HFBackend(tmp / "saved", dtype="float32", device="cpu").close()
        print("saved and loaded")
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True,
                         text=True, cwd=ROOT, env=_env())
    assert run.returncode == 0, run.stderr
    assert "saved and loaded" in run.stdout
    assert _third_party_noise(run.stdout + run.stderr) == []


@pytest.fixture(scope="module")
def tiny_with_warm_adapters(tmp_path_factory) -> tuple[Path, Path]:
    """The tiny model and a folder with a warm start's LoRA adapters on it (``actor/``,
    ``extractor/``), as ``crl warmstart`` leaves them; built once, in this process (a subprocess
    would pay torch's import again), for the tests that start the CLI on them. A test copies
    the folder, so a run that writes there cannot change what the next one starts from."""
    pytest.importorskip("peft")
    from crl_harness.config.schema import LoRAConfig
    from crl_harness.models.hf import HFBackend
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.training.learner import PolicyLearner

    folder = tmp_path_factory.mktemp("tiny")
    model = build_tiny_model(folder / "tiny")
    for role in ("actor", "extractor"):
        backend = HFBackend(model, dtype="float32", device="cpu")
        PolicyLearner(backend.model, lr=1e-3, max_grad_norm=1.0, temperature=1.0,
                      micro_batch_size=2, lora=LoRAConfig(enabled=True)).save_adapter(
            folder / "warm" / role, str(model))
        backend.close()
    return model, folder / "warm"


@pytest.mark.slow
def test_crl_train_and_eval_on_the_tiny_model_are_quiet_unless_verbose(tmp_path,
                                                                        tiny_with_warm_adapters):
    """``crl train`` (its warm start's adapters loaded and continued, a checkpoint's adapters
    saved) and ``crl eval`` of that checkpoint print no warning and no library bar; ``crl eval
    --verbose`` shows the bars."""
    model, warm = tiny_with_warm_adapters
    shutil.copytree(warm, tmp_path / "warm")
    crl = [sys.executable, "-m", "crl_harness.cli"]
    run_dir = tmp_path / "run"
    train = subprocess.run(
        [*crl, "train", "cpu-demo", "arm=none", f"warmstart.model=hf:{model}",
         f"warmstart.output_dir={tmp_path / 'warm'}", "actor.dtype=float32",
         "actor.rollout_engine=hf", "tasks.groups_per_step=1", "tasks.group_size=2",
         "actor.warmup_steps=0", "actor.max_new_tokens=8", "run.steps=1",
         f"run.output_dir={run_dir}", "run.tensorboard=false", "run.torch_threads=1",
         "--no-progress"],
        capture_output=True, text=True, cwd=ROOT, env=_env())
    assert train.returncode == 0, train.stderr
    assert _third_party_noise(train.stdout + train.stderr) == []
    [actor] = run_dir.glob("checkpoints/*/actor_hf")
    evaluate = [*crl, "eval", "--agent", f"hf:{actor}", "--envs", "CRL/Sokoban-v0",
                "--episodes", "1", "--max-new-tokens", "4", "--no-progress"]
    quiet = subprocess.run([*evaluate, "--out", str(tmp_path / "eval")], capture_output=True,
                           text=True, cwd=ROOT, env=_env())
    assert quiet.returncode == 0, quiet.stderr
    assert _third_party_noise(quiet.stdout + quiet.stderr) == []
    verbose = subprocess.run([*evaluate, "--out", str(tmp_path / "eval-verbose"), "--verbose"],
                             capture_output=True, text=True, cwd=ROOT, env=_env())
    assert verbose.returncode == 0, verbose.stderr
    assert "Loading weights" in verbose.stderr


@pytest.mark.slow
def test_crl_warmstart_on_the_tiny_model_is_quiet_unless_verbose(tmp_path):
    from crl_harness.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    warmstart = [sys.executable, "-m", "crl_harness.cli", "warmstart", "cpu-demo",
                 f"warmstart.model=hf:{model}", "warmstart.episodes=2",
                 "warmstart.extractor_samples=1", "warmstart.epochs=1",
                 "warmstart.extractor_epochs=1", "warmstart.lora.top_layers=1",
                 "warmstart.lora.r=4", "warmstart.dtype=float32", "run.torch_threads=1",
                 "actor.max_new_tokens=128", "extractor.max_new_tokens=192"]
    quiet = subprocess.run([*warmstart, f"warmstart.output_dir={tmp_path / 'quiet'}"],
                           capture_output=True, text=True, cwd=ROOT, env=_env())
    assert quiet.returncode == 0, quiet.stderr
    assert (tmp_path / "quiet" / "actor" / "adapter_config.json").exists()
    assert _third_party_noise(quiet.stdout + quiet.stderr) == []
    # --verbose shows the bars as it does for train and eval (the test above)
    from crl_harness.cli import build_parser

    assert build_parser().parse_args(["warmstart", "cpu-demo", "--verbose"]).verbose


@pytest.mark.slow
def test_crl_demo_on_the_tiny_model_prints_no_warning(tmp_path, tiny_with_warm_adapters):
    """The whole ``crl demo`` (the scripted table, the warm start's held-out levels, a training
    step, the trained actor's levels, the test-time check) on the tiny model: no line of its
    output is a warning or a library's load bar."""
    model, warm = tiny_with_warm_adapters
    shutil.copytree(warm, tmp_path / "warm")
    demo = subprocess.run(
        [sys.executable, "-m", "crl_harness.cli", "demo", "--envs",
         "CRL/Sokoban-v0,CRL/SWEBenchToy-v0",  # the toy's LocalSandbox warned in every demo
         "--episodes", "1", "--eval-levels", "2", "--test-time-levels", "1",
         "--out", str(tmp_path / "demo"), f"warmstart.model=hf:{model}",
         f"warmstart.output_dir={tmp_path / 'warm'}", "actor.dtype=float32",
         "extractor.dtype=float32", "actor.rollout_engine=hf", "extractor.rollout_engine=hf",
         "tasks.groups_per_step=1", "tasks.group_size=2", "tasks.guided_per_group=1",
         "tasks.new_per_step=1", "actor.max_new_tokens=8", "extractor.max_new_tokens=8",
         "run.steps=2", "run.torch_threads=1", "arm=static"],  # 2 steps: too short to co-evolve
        capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=900)
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "held-out" in demo.stdout
    assert _third_party_noise(demo.stdout + demo.stderr) == []


@pytest.mark.slow
def test_a_vllm_engine_starts_without_warnings_or_bars_once_quiet(vllm_start_on_an_adapter):
    """vLLM's CPU engine, started after ``quiet_third_party``, prints none of what a demo showed
    at every start: its loader's "Loading safetensors checkpoint shards" bar, torch's C++ "NUMA
    binding" warning, vLLM's FutureWarnings about torch names, its Triton line at import; nor
    does merging a warm start's adapter for it. (The child's start, on an adapter, is shared with
    tests/harness/models/test_vllm_backend.py: tests/conftest.py.)"""
    start = vllm_start_on_an_adapter
    assert start.returncode == 0, start.stderr[-3000:]
    assert start.vllm_tokens, "the engine generated nothing"
    output = start.engine_output
    assert "Loading safetensors" not in output and "Triton is installed" not in output
    assert _third_party_noise(output) == [], output[-2000:]
