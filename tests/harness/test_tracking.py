"""``--report-to wandb mlflow``: ``crl train`` logs each step's metrics and ``crl eval`` its results
per env to an offline W&B run and an MLflow file-store run, read back here; a missing package is
one line naming the extra."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from crl_harness.cli import main


def _wandb_history(run_dir: Path) -> list[dict]:
    """The ``history`` records (the logged steps) of the one offline W&B run under ``run_dir``,
    read from its ``.wandb`` file: LevelDB-log framing (32 KiB blocks; each chunk a 7-byte header
    of checksum, little-endian length and type: 1 full, 2 first, 3 middle, 4 last) around
    ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    [path] = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, pieces, history = 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        length = int.from_bytes(data[position + 4:position + 6], "little")
        kind = data[position + 6]
        pieces += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            if record.WhichOneof("record_type") == "history":
                # a key with "/" comes as nested_key (its one part here), a plain one as key
                history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                for item in record.history.item})
    return history


@pytest.fixture
def offline_services(tmp_path, monkeypatch):
    """W&B offline and MLflow on a file store under ``tmp_path``; the MLflow store's URI."""
    pytest.importorskip("wandb", reason="pip install 'crl-gym[tracking]'")
    pytest.importorskip("mlflow", reason="pip install 'crl-gym[tracking]'")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    store = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return store


def _mlflow_run(store: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    [experiment] = [e for e in client.search_experiments() if e.name == "crl-gym"]
    [run] = client.search_runs([experiment.experiment_id])
    return client, run


@pytest.mark.slow
def test_crl_train_reports_each_steps_metrics_to_wandb_and_mlflow(tmp_path, offline_services):
    from crl_harness.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    run = tmp_path / "run"
    assert main(["train", "sokoban", "arm=none", "name=tracked", f"actor.model=hf:{model}",
                 f"extractor.model=hf:{model}", "tasks.envs.0.kwargs={max_episode_steps: 2}",
                 "tasks.groups_per_step=1", "tasks.group_size=2", "tasks.guided_per_group=0",
                 "actor.max_new_tokens=4", "actor.warmup_steps=0", "run.steps=2",
                 "run.tensorboard=false", "run.torch_threads=1", f"run.output_dir={run}",
                 "--no-progress", "--report-to", "wandb", "mlflow"]) == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == [1, 2]

    history = _wandb_history(run)
    assert [h["_step"] for h in history] == [1, 2]
    for h, m in zip(history, logged, strict=True):
        assert h["success/all"] == m["success/all"] and h["reward/all"] == m["reward/all"]

    client, mlflow_run = _mlflow_run(offline_services)
    assert mlflow_run.info.run_name == "tracked-none"
    steps = {m.step: m.value for m in client.get_metric_history(mlflow_run.info.run_id,
                                                                "reward/all")}
    assert steps == {m["step"]: m["reward/all"] for m in logged}


def test_crl_eval_reports_its_results_per_env(tmp_path, offline_services):
    out = tmp_path / "ev"
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "3",
                 "--no-progress", "--out", str(out), "--report-to", "mlflow", "wandb"]) == 0
    [history] = _wandb_history(out)
    assert history["CRL/Sokoban-v0/success_rate"] == 1.0
    assert history["CRL/Sokoban-v0/episodes"] == 3.0
    client, run = _mlflow_run(offline_services)
    assert run.data.metrics["CRL/Sokoban-v0/success_rate"] == 1.0
    assert run.data.params == {} and run.info.run_name == "ev"


@pytest.mark.parametrize("service", ["wandb", "mlflow"])
def test_hardening_report_to_without_its_package_is_one_line(tmp_path, capsys, monkeypatch,
                                                             service):
    monkeypatch.setitem(sys.modules, service, None)  # as where the extra is not installed
    out = tmp_path / "ev"
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--no-progress", "--out", str(out), "--report-to", service]) == 2
    assert capsys.readouterr().err == (
        f"crl eval: --report-to {service} needs the tracking extra (No module named "
        f"'{service}'): pip install 'crl-gym[tracking]'.\n")
    assert not (out / "results.jsonl").exists()  # checked before anything ran


def test_hardening_crl_train_report_to_without_its_package_is_one_line(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert main(["train", "sokoban", f"run.output_dir={tmp_path / 'run'}", "--report-to",
                 "mlflow"]) == 2
    assert capsys.readouterr().err == (
        "crl train: --report-to mlflow needs the tracking extra (No module named 'mlflow'): "
        "pip install 'crl-gym[tracking]'.\n")
    assert not (tmp_path / "run" / "checkpoints").exists()


EFFICACY = Path(__file__).resolve().parents[2] / "benchmarks" / "efficacy.py"


@pytest.mark.slow
def test_efficacy_reports_each_runs_step_metrics_to_wandb_and_mlflow(tmp_path, offline_services):
    """``benchmarks/efficacy.py --report-to``: each arm and seed is one tracked run, with the
    steps of its metrics.jsonl (the run trains in a process of its own, which the services'
    environment variables reach)."""
    import subprocess

    from crl_harness.models.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(EFFICACY), "--out", str(out), "--steps", "2", "--repeats", "1",
         "--arms", "none", "--eval-levels", "1", "--extractor-quality", "0",
         "--report-to", "wandb", "mlflow", "--set", f"actor.model=hf:{tiny}",
         "actor.lora.init_from=null", "actor.dtype=float32", "actor.max_new_tokens=4",
         "tasks.envs.0.kwargs={max_episode_steps: 2}", "tasks.group_size=2",
         "tasks.guided_per_group=1", "tasks.groups_per_step=1", "run.tensorboard=false"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = out / "none-seed0"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == [1, 2]
    history = _wandb_history(run)
    assert [h["_step"] for h in history] == [1, 2]
    assert [h["reward/all"] for h in history] == [m["reward/all"] for m in logged]
    client, mlflow_run = _mlflow_run(offline_services)
    assert mlflow_run.info.run_name.endswith("-none-seed0")
    steps = {m.step: m.value for m in client.get_metric_history(mlflow_run.info.run_id,
                                                                "reward/all")}
    assert steps == {m["step"]: m["reward/all"] for m in logged}


def test_hardening_efficacy_report_to_without_its_package_is_a_usage_error(tmp_path, capsys,
                                                                           monkeypatch):
    """Before anything trains or a folder is made, as crl train says it."""
    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    import efficacy

    monkeypatch.setitem(sys.modules, "wandb", None)  # as where the extra is not installed
    monkeypatch.setattr(sys, "argv", ["efficacy.py", "--out", str(tmp_path / "out"),
                                      "--report-to", "wandb"])
    with pytest.raises(SystemExit) as stopped:
        efficacy.main()
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "efficacy.py: error: --report-to wandb needs the tracking extra (No module named "
        "'wandb'): pip install 'crl-gym[tracking]'.")
    assert not (tmp_path / "out").exists()
