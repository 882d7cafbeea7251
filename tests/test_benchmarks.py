"""The benchmark scripts' own flags: bad values stop with a usage error before anything trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EFFICACY = Path(__file__).resolve().parents[1] / "benchmarks" / "efficacy.py"
PILOT = Path(__file__).resolve().parents[1] / "benchmarks" / "pilot_curve.py"


@pytest.mark.parametrize(("flags", "message"), [
    (["--jobs", "0"], "--jobs must be in 1..16"),
    (["--jobs", "17"], "--jobs must be in 1..16"),
    (["--repeats", "0"], "--repeats must be in 1..20"),
    (["--steps", "0"], "--steps in 1..10000"),
    (["--arms", "grpo"], "invalid choice"),
    (["--eval-levels", "0"], "--eval-levels must be in 1..10000"),
    (["--eval-levels", "10001"], "--eval-levels must be in 1..10000"),
    (["--set", "actor.no_such_key=1"], "no_such_key"),
])
def test_hardening_efficacy_flags_out_of_range_stop_with_usage(tmp_path, flags, message):
    done = subprocess.run([sys.executable, str(EFFICACY), "--out", str(tmp_path / "out"), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "out").exists()  # stopped before writing anything


def test_hardening_efficacy_stops_at_the_first_failed_run_and_names_it(tmp_path):
    done = subprocess.run(
        [sys.executable, str(EFFICACY), "--out", str(tmp_path), "--steps", "1", "--repeats", "2",
         "--arms", "none", "--jobs", "1", "--set", f"actor.model=hf:{tmp_path / 'no-such-model'}",
         "actor.lora.init_from=null"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "efficacy: the none run of seed 0 failed" in done.stderr
    assert "no-such-model" in done.stderr
    assert "Traceback" not in done.stderr  # one line, as `crl` says it
    assert not (tmp_path / "none-seed1").exists()  # the second run was never started
    assert not (tmp_path / "efficacy.json").exists()


def test_hardening_efficacy_empty_arms_a_file_as_out_and_a_negative_seed_are_usage_errors(
        tmp_path, monkeypatch, capsys):
    import runpy

    a_file = tmp_path / "a-file"
    a_file.write_text("kept\n")
    for flags, message in ((["--arms"], "--arms needs at least one of"),
                           (["--out", str(a_file)], "cannot create this folder"),
                           (["--out", str(a_file / "sub")], "cannot create this folder"),
                           (["--seed", "-1"], "bad config key 'run.seed'")):
        monkeypatch.setattr(sys, "argv", ["efficacy.py", "--out", str(tmp_path / "out"), *flags])
        with pytest.raises(SystemExit) as stopped:  # in this process: no interpreter to start
            runpy.run_path(str(EFFICACY), run_name="__main__")
        err = capsys.readouterr().err
        assert stopped.value.code == 2 and message in err and "Traceback" not in err, flags
    assert a_file.read_text() == "kept\n" and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--steps", "0"], "--steps must be in 1..1000"),
    (["--levels", "0"], "--levels in 1..10000"),
    (["--steps", "4", "--eval-at", "5"], "every --eval-at step must be in 1..--steps (4)"),
    (["--eval-at", "0"], "every --eval-at step must be in 1..--steps"),
    (["--arm", "grpo"], "invalid choice"),
    (["--set", "actor.no_such_key=1"], "no_such_key"),
])
def test_hardening_pilot_curve_flags_stop_with_usage_before_training(tmp_path, flags, message):
    done = subprocess.run([sys.executable, str(PILOT), "--out", str(tmp_path / "out"), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "out").exists()
