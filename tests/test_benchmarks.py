"""The benchmark scripts' own flags: bad values stop with a usage error before anything trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EFFICACY = Path(__file__).resolve().parents[1] / "benchmarks" / "efficacy.py"


@pytest.mark.parametrize(("flags", "message"), [
    (["--jobs", "0"], "--jobs must be in 1..16"),
    (["--jobs", "17"], "--jobs must be in 1..16"),
    (["--repeats", "0"], "--repeats must be in 1..20"),
    (["--steps", "0"], "--steps in 1..10000"),
    (["--arms", "grpo"], "invalid choice"),
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
         "--arms", "none", "--jobs", "1", "--set", f"actor.model=hf:{tmp_path / 'no-such-model'}"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "efficacy: the none run of seed 0 failed" in done.stderr
    assert "no-such-model" in done.stderr
    assert "Traceback" not in done.stderr  # one line, as `crl` says it
    assert not (tmp_path / "none-seed1").exists()  # the second run was never started
    assert not (tmp_path / "efficacy.json").exists()
