"""One run per run directory, and the paired held-out evaluation (issue 32, items 1 and 2).

Real envs (Sokoban) and the tiny random Llama of ``crl_harness.models.tiny``: a run here trains
nothing useful, but writes its bank, metrics and checkpoints as any run does.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from crl_harness.cli import main
from crl_harness.config import load_config
from crl_harness.eval import PairedDifference, paired_difference
from crl_harness.experience import BankError, ExperienceBank
from crl_harness.experience.checkpoint import restore_bank
from crl_harness.models.tiny import build_tiny_model
from crl_harness.training.checkpoint import Checkpointer, checkpoint_run_id
from crl_harness.training.metrics import read_metrics
from crl_harness.training.run_directory import occupied, read_run_id
from crl_harness.training.trainer import ResumeError, RunDirectoryError, Trainer

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def _overrides(model: Path, run_dir: Path, arm: str = "static", steps: int = 1) -> list[str]:
    return [f"arm={arm}", f"actor.model=hf:{model}", f"extractor.model=hf:{model}",
            "tasks.envs.0.id=CRL/Sokoban-v0", "tasks.envs.0.kwargs={max_episode_steps: 2}",
            "tasks.groups_per_step=1", "tasks.group_size=2", "tasks.guided_per_group=1",
            "actor.warmup_steps=0", "actor.max_new_tokens=8", "extractor.max_new_tokens=8",
            f"run.steps={steps}", "run.checkpoint_every=1", "run.keep_checkpoints=1",
            f"run.output_dir={run_dir}", "run.tensorboard=false", "run.torch_threads=1"]


def _initial_bank(folder: Path) -> str:
    with ExperienceBank(folder / "seed" / "bank.sqlite") as bank:
        bank.add("CRL/Sokoban-v0", "Corners", "Never push a box into a corner.")
        bank.export_jsonl(folder / "seed" / "bank.jsonl")
    return f"experience.initial_bank={folder / 'seed' / 'bank.jsonl'}"


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the lock file aside) with the hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "run.lock"}


@pytest.fixture(scope="module")
def finished_run(model, tmp_path_factory) -> Path:
    """A finished static-arm run of one step, started from a bank of one entry."""
    root = tmp_path_factory.mktemp("finished")
    cfg = load_config(None, [*_overrides(model, root / "run"), _initial_bank(root)])
    Trainer(cfg).train()
    return root / "run"


def test_fresh_run_into_an_occupied_directory_refuses_and_loses_nothing(model, finished_run,
                                                                         capsys):
    before = _snapshot(finished_run)
    assert "bank.sqlite" in before and "metrics.jsonl" in before
    cfg = load_config(None, _overrides(model, finished_run))
    with pytest.raises(RunDirectoryError, match="holds another run .*--resume.*--overwrite"):
        Trainer(cfg)
    # and from the command line: one line, exit code 2
    config = finished_run.parent / "tiny.yaml"
    config.write_text("name: tiny\n")
    assert main(["train", str(config), *_overrides(model, finished_run), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--resume" in err and "--overwrite" in err
    assert _snapshot(finished_run) == before


def test_overwrite_starts_a_fresh_run_with_an_empty_bank_and_metrics(model, tmp_path):
    run_dir = tmp_path / "run"
    Trainer(load_config(None, [*_overrides(model, run_dir), _initial_bank(tmp_path)])).train()
    old_id = read_run_id(run_dir)
    (run_dir / "warmstart").mkdir()  # not a run's file: left alone
    (run_dir / "warmstart" / "notes.txt").write_text("keep me")
    trainer = Trainer(load_config(None, _overrides(model, run_dir, steps=2)), overwrite=True)
    assert trainer.run.run_id != old_id
    assert len(trainer.experience.bank) == 0
    assert not (run_dir / "metrics.jsonl").exists() or not read_metrics(run_dir / "metrics.jsonl")
    assert not (run_dir / "checkpoints").exists()
    trainer.train()
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2]
    assert [checkpoint_run_id(p) for p in (run_dir / "checkpoints").iterdir()] == \
        [trainer.run.run_id]
    assert (run_dir / "warmstart" / "notes.txt").read_text() == "keep me"


def test_fresh_run_in_a_new_directory_starts_with_an_empty_bank(model, tmp_path):
    trainer = Trainer(load_config(None, _overrides(model, tmp_path / "run")))
    try:
        assert len(trainer.experience.bank) == 0 and trainer.step == 0
    finally:
        trainer.close()


def test_pruning_keeps_this_runs_checkpoints_and_leaves_another_runs(tmp_path):
    """The issue's case: an earlier 12-step run's checkpoint is in the folder; a 4-step run that
    keeps one checkpoint keeps its own step 4, and step 12 is neither latest nor pruned."""
    earlier = Checkpointer(tmp_path, "earlier", keep=1).save(12, lambda d: None)
    mine = Checkpointer(tmp_path, "mine", keep=1)
    for step in (2, 4):
        mine.save(step, lambda d: (d / "state.json").write_text("{}"))
    assert [p.name for p in mine.all()] == ["step-000004"] and mine.latest().name == "step-000004"
    assert earlier.exists() and checkpoint_run_id(earlier) == "earlier"
    with pytest.raises(FileExistsError, match="another run"):
        mine.save(12, lambda d: None)
    assert checkpoint_run_id(earlier) == "earlier"


def test_refused_resume_leaves_the_live_runs_files(model, tmp_path):
    run_dir = tmp_path / "run"
    cfg = load_config(None, [*_overrides(model, run_dir), _initial_bank(tmp_path)])
    Trainer(cfg).train()
    live = Trainer(load_config(None, _overrides(model, run_dir, steps=3)), resume=True)
    try:
        live.experience.flush()
        before = _snapshot(run_dir)
        assert {"bank.sqlite", "bank.sqlite-wal", "bank.sqlite-shm"} <= set(before)
        with pytest.raises(RunDirectoryError, match="in use by a live run"):
            Trainer(load_config(None, _overrides(model, run_dir, steps=3)), resume=True)
        with pytest.raises(RunDirectoryError, match="in use by a live run"):
            Trainer(load_config(None, _overrides(model, run_dir)), overwrite=True)
        # the bank layer refuses too, before it removes anything
        with pytest.raises(BankError, match="open for writing"):
            restore_bank(run_dir, live.checkpoints.latest())
        assert _snapshot(run_dir) == before
        assert len(live.experience.bank) == 1
    finally:
        live.close()


def test_resume_with_another_arm_changes_nothing(model, finished_run):
    before = _snapshot(finished_run)
    with pytest.raises(ResumeError, match="arm 'static', not 'none'"):
        Trainer(load_config(None, _overrides(model, finished_run, arm="none")), resume=True)
    assert _snapshot(finished_run) == before


def test_demo_evaluates_the_checkpoint_its_training_returned(model, tmp_path, monkeypatch):
    from crl_harness.commands import demo
    from crl_harness.commands import train as train_command
    from crl_harness.eval import heldout

    returned, played = [], []
    train, evaluate_levels = train_command.train, heldout.evaluate_levels
    monkeypatch.setattr(train_command, "train",
                        lambda *a, **k: returned.append(train(*a, **k)) or returned[-1])
    monkeypatch.setattr(heldout, "evaluate_levels",
                        lambda cfg, actor, *a, **k: played.append(actor)
                        or evaluate_levels(cfg, actor, *a, **k))
    cfg = load_config(None, _overrides(model, tmp_path / "demo" / "run", steps=2))
    checkpoint = demo.train_and_evaluate(cfg, 3, tmp_path / "demo", cache=tmp_path / "cache")
    run_dir = tmp_path / "demo" / "run"
    assert returned == [checkpoint] == [run_dir / "checkpoints" / "step-000002"]
    assert checkpoint_run_id(checkpoint) == read_run_id(run_dir)
    assert played == [f"hf:{model}", f"hf:{checkpoint / 'actor_hf'}"]
    levels = json.loads((tmp_path / "demo" / "levels.json").read_text())["levels"]
    assert len(levels["held-out"]["before"]) == len(levels["held-out"]["after"]) == 3
    assert levels["held-out"]["paired"]["n"] == 3
    # the trained actor on the held-out levels with the run's bank too, paired against without
    assert len(levels["held-out"]["after_with_bank"]) == 3
    assert levels["held-out"]["with_bank_paired"]["n"] == 3


def test_paired_interval_and_mcnemar_p_match_a_hand_computation():
    # 20 levels: 5 won by both, 2 only before (A), 7 only after (B), 6 by neither.
    a = [True] * 5 + [True] * 2 + [False] * 7 + [False] * 6
    b = [True] * 5 + [False] * 2 + [True] * 7 + [False] * 6
    d = paired_difference(a, b)
    assert (d.n, d.a_wins, d.b_wins, d.only_a, d.only_b) == (20, 7, 12, 2, 7)
    # d = (7 - 2) / 20; se = sqrt(2 + 7 - 5^2 / 20) / 20; p = 2 P(X <= 2), X ~ Bin(9, 1/2)
    se = math.sqrt(7.75) / 20
    assert d.difference == pytest.approx(0.25)
    assert d.interval == pytest.approx((0.25 - 1.96 * se, 0.25 + 1.96 * se))
    assert d.mcnemar_p == pytest.approx(2 * (1 + 9 + 36) / 2**9)
    assert PairedDifference(n=10, a_wins=3, b_wins=3, only_a=0, only_b=0).mcnemar_p == 1.0


# ------------------------------------------------------------------ hardening
@pytest.mark.parametrize(("argv", "message"), [
    (["demo", "--eval-levels", "0"], "--eval-levels must be between 1 and 10000, got 0."),
    (["demo", "--eval-levels", "10001"], "--eval-levels must be between 1 and 10000"),
    (["train", "cpu-demo", "--resume", "--overwrite"], "give one"),
])
def test_hardening_new_flags_are_bounded_with_one_line(argv, message, capsys, tmp_path,
                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not list(tmp_path.iterdir())  # refused before writing anything


def test_hardening_demo_out_holding_a_run_refuses_before_anything_runs(finished_run, capsys):
    out = finished_run.parent / "demo-out"
    (out / "cpu-demo").mkdir(parents=True)
    (out / "cpu-demo" / "run.json").write_text('{"run_id": "x"}')
    assert main(["demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds an earlier demo's run" in err
    assert not (out / "scripted").exists()


def test_hardening_initial_bank_that_is_no_file_is_one_line(model, tmp_path, capsys):
    missing, config = tmp_path / "no-such-bank.jsonl", tmp_path / "tiny.yaml"
    config.write_text("name: tiny\n")
    assert main(["train", str(config), *_overrides(model, tmp_path / "run"),
                 f"experience.initial_bank={missing}", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "experience.initial_bank" in err and "no such file" in err
    assert occupied(tmp_path / "run") == []
    # the folder is free: the corrected command is not refused as "another run"
    Trainer(load_config(None, _overrides(model, tmp_path / "run"))).close()
