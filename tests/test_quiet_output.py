"""Quiet output: each of our warnings once a process, no third-party warnings or progress bars
that our code triggers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    """This environment with the worktree's code first on the path."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


@pytest.mark.slow
def test_demo_table_is_quiet(tmp_path):
    """Our warnings once a process (the toy's sandbox warns at every reset); no pkg_resources
    warning from minihack's import."""
    run = subprocess.run(
        [sys.executable, "-m", "crl_harness.cli", "demo", "--no-train", "--envs",
         "CRL/MiniHackRoom-v0,CRL/SWEBenchToy-v0", "--episodes", "2", "--out",
         str(tmp_path / "demo")],
        capture_output=True, text=True, cwd=ROOT, env=_env())
    assert run.returncode == 0, run.stderr
    output = run.stdout + run.stderr
    assert "pkg_resources" not in output
    assert output.count("UnisolatedSandboxWarning") == 1


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
