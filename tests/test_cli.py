"""The ``crl`` command line: play, data, and clear errors instead of tracebacks."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from crl_harness.cli import main
from crl_harness.commands.play import play


def test_play_reads_actions_reports_invalid_and_quits_on_eof():
    stdin = io.StringIO("dance\nup\n")  # then EOF
    stdout = io.StringIO()
    returns = play("CRL/Sokoban-v0", seed=0, stdin=stdin, stdout=stdout)
    text = stdout.getvalue()
    assert "invalid action" in text.lower()
    assert "[step 2" in text and "Bye." in text
    assert returns == []  # the episode did not finish


def test_play_finishes_an_episode_with_the_oracle_moves():
    import gymnasium as gym

    from crl_envs.oracles import make_oracle

    env = gym.make("CRL/Sokoban-v0")
    obs, info = env.reset(seed=5)
    oracle = make_oracle("CRL/Sokoban-v0", env)
    oracle.reset(obs, info)
    moves, done = [], False
    while not done:
        action = oracle.act(obs, info)
        moves.append(action)
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    assert info["won"]
    stdout = io.StringIO()
    returns = play("CRL/Sokoban-v0", seed=5, stdin=io.StringIO("\n".join(moves) + "\n"), stdout=stdout)
    assert returns == [1.0] and "WON" in stdout.getvalue()


def test_play_unknown_env_is_a_clear_error(capsys):
    assert main(["play", "CRL/Nope-v0"]) == 2
    assert "Unknown env id" in capsys.readouterr().err


def test_missing_dataset_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    from crl_envs import data

    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CRL_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "_checkout_shared_data", lambda: tmp_path / "none")
    with pytest.raises(data.DataNotFoundError, match="crl data fetch webshop"):
        data.resolve_data("webshop", required=("docs_1k.jsonl",))


def test_console_script_help_runs():
    out = subprocess.run([sys.executable, "-m", "crl_harness.cli", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "play" in out.stdout
