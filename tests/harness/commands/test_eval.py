"""``crl eval``: scripted and model agents on real envs, the report files, the statistics."""

from __future__ import annotations

import json
import re

import pytest

from crl_envs.errors import UserFacingError
from crl_harness.cli import main
from crl_harness.commands.env_kwargs import parse_env_kwargs
from crl_harness.eval import expand_env_ids, parse_seeds, summarize, wilson_interval
from crl_harness.results import read_attempts, tally
from crl_harness.rollout import Trajectory


def test_wilson_interval_brackets_the_rate():
    low, high = wilson_interval(7, 20)
    assert low < 7 / 20 < high
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_hardening_wilson_interval_holds_the_rate_so_the_chart_draws_all_or_nothing(tmp_path):
    """6/6 once gave an upper end of 0.9999999999999999 (0/11 a lower end above 0): a negative
    error bar, and matplotlib ended ``crl eval --agent scripted --episodes 6`` with a traceback."""
    from crl_harness.eval import plot_success

    for n in range(1, 300):
        for successes in (0, 1, n // 2, n - 1, n):
            low, high = wilson_interval(successes, n)
            assert 0.0 <= low <= successes / n <= high <= 1.0, (successes, n)
    summaries = summarize([Trajectory("CRL/Sokoban-v0", seed, won=True, steps=3)
                           for seed in range(6)] +
                          [Trajectory("CRL/MiniHackRoom-v0", seed, steps=3) for seed in range(11)])
    plot_success(tmp_path / "success.png", summaries)
    assert (tmp_path / "success.png").stat().st_size > 0


def test_summaries_count_steps_of_wins_invalid_rates_and_errors():
    trajs = [Trajectory("E", 0, won=True, steps=4, invalid_actions=1),
             Trajectory("E", 1, won=True, steps=6, format_failures=2, invalid_actions=2),
             Trajectory("E", 2, won=False, steps=10),
             Trajectory("E", 3, error="RuntimeError: boom")]
    [s] = summarize(trajs)
    assert (s.episodes, s.successes, s.errors) == (3, 2, 1)
    assert s.success_rate == pytest.approx(2 / 3) and s.mean_steps_success == 5
    assert s.invalid_action_rate == pytest.approx(3 / 20)
    assert s.format_failure_rate == pytest.approx(2 / 20)


def test_env_and_seed_arguments():
    assert expand_env_ids("mix3") == ["CRL/MiniHackRoom-v0", "CRL/WebShop-v0", "CRL/ALFWorld-v0"]
    assert "CRL/SWEBenchToy-v0" in expand_env_ids("all")
    with pytest.raises(UserFacingError, match="neither an env id"):
        expand_env_ids("CRL/Nope-v0")
    assert parse_seeds(None, 3) == [0, 1, 2] and parse_seeds("7", None) == list(range(7, 17))
    with pytest.raises(UserFacingError, match="disagrees"):
        parse_seeds("0-4", 3)
    with pytest.raises(UserFacingError, match="Bad --seeds"):
        parse_seeds("a-b", None)


def test_crl_eval_scripted_writes_table_report_results_and_chart(tmp_path, capsys):
    out = tmp_path / "ev"
    code = main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "4",
                 "--seeds", "10", "--workers", "2", "--out", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "CRL/Sokoban-v0" in printed and "100.0%" in printed
    report = json.loads((out / "report.json").read_text())
    [env] = report["envs"]
    assert env["episodes"] == 4 and env["successes"] == 4 and env["invalid_action_rate"] == 0
    assert report["meta"]["seeds"] == [10, 11, 12, 13]
    attempts = read_attempts(out / "results.jsonl")
    assert sorted(a.seed for a in attempts) == [10, 11, 12, 13] and all(a.won for a in attempts)
    assert set(tally(attempts)) == set(report["tasks"]["CRL/Sokoban-v0"])
    assert (out / "success.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The same folder again is refused rather than mixing two runs' attempts.
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--out", str(out), "--no-progress"]) == 2


def test_crl_eval_model_agent_on_the_tiny_model(tmp_path):
    pytest.importorskip("transformers")
    from crl_harness.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    out = tmp_path / "ev"
    assert main(["eval", "--agent", f"hf:{model}", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--max-new-tokens", "4", "--history", "1", "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    [env] = report["envs"]
    assert env["episodes"] == 1 and env["format_failure_rate"] == 1.0
    assert 0 < env["generated_tokens"] <= 30 * 4
    assert len(read_attempts(out / "results.jsonl")) == 1


def test_crl_eval_missing_model_is_one_clear_error(tmp_path, capsys):
    code = main(["eval", "--agent", f"hf:{tmp_path / 'none'}", "--envs", "CRL/Sokoban-v0",
                 "--episodes", "1", "--out", str(tmp_path / "ev"), "--no-progress"])
    assert code == 2 and "Could not load" in capsys.readouterr().err
    assert not (tmp_path / "ev").exists()  # a failed start leaves no empty eval folder


def test_errored_envs_hardening_show_as_errors_in_table_and_plot(tmp_path):
    from rich.console import Console

    from crl_harness.eval import plot_success, render_table

    summaries = summarize([Trajectory("CRL/Broken-v0", 0, error="RuntimeError: no data"),
                           Trajectory("CRL/Broken-v0", 1, error="RuntimeError: no data"),
                           Trajectory("CRL/Sokoban-v0", 0, won=True, steps=3)])
    console = Console(record=True, width=160)
    console.print(render_table(summaries))
    broken, sokoban = console.export_text().splitlines()[3:5]
    assert "error" in broken and "%" not in broken and broken.rstrip(" │").endswith("2")
    assert "100.0%" in sokoban
    plot_success(tmp_path / "success.png", summaries)
    assert (tmp_path / "success.png").stat().st_size > 0


def test_hardening_crl_eval_kv_cache_flags(tmp_path, capsys):
    pytest.importorskip("transformers")
    from crl_harness.models.tiny import build_tiny_model

    code = main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--kv-cache-tokens", "0", "--out", str(tmp_path / "bad"), "--no-progress"])
    assert code == 2 and "--kv-cache-tokens must be >= 1" in capsys.readouterr().err
    model = build_tiny_model(tmp_path / "tiny")
    # 3 turns an episode: the later turns are where a reused (or capped) cache would serve the
    # conversation's prefix; the first prompt alone is longer than the 50-token cap
    for flags, name in ((["--no-kv-reuse"], "off"), (["--kv-cache-tokens", "50"], "tiny-cap")):
        out = tmp_path / name
        assert main(["eval", "--agent", f"hf:{model}", "--envs", "CRL/Sokoban-v0", "--episodes",
                     "2", "--max-new-tokens", "4", "--env-kwargs", "max_episode_steps=3",
                     "--out", str(out), "--no-progress", *flags]) == 0
        report = json.loads((out / "report.json").read_text())
        assert report["envs"][0]["episodes"] == 2
        assert all(e["steps"] == 3 for e in report["episodes"]), "a lost episode plays 3 turns"


def test_hardening_crl_eval_env_kwargs(tmp_path, capsys):
    def run(name: str, *words: str) -> int:
        return main(["eval", "--agent", "scripted", "--envs", "CRL/MiniHackRoom-v0", "--episodes",
                     "2", "--env-kwargs", *words, "--out", str(tmp_path / name), "--no-progress"])

    for words, message in ((["{variant: dark"], "not valid JSON"), (["[1, 2]"], "JSON object"),
                           (["[" * 3000], "nests too deeply"),
                           (['{"no_such_arg": 1}'], "takes no argument 'no_such_arg'; it takes:"),
                           (["no_such_arg=1"], "takes no argument 'no_such_arg'"),
                           (["variant"], "is not KEY=VALUE"), (["2x=1"], "is not KEY=VALUE"),
                           (["variant=dark", "variant=lit"], "given twice"),
                           (["variant=no-such-variant"], "do not fit CRL/MiniHackRoom-v0"),
                           (["{" + " " * 5000 + "}"], "at most 4096"),
                           ([f"k{i}=1" for i in range(1000)], "at most 4096")):
        assert run("bad", *words) == 2 and message in capsys.readouterr().err, words
    assert run("dark", '{"variant": "dark", "max_episode_steps": 3}') == 0
    report = json.loads((tmp_path / "dark" / "report.json").read_text())
    assert report["meta"]["env_kwargs"] == {"variant": "dark", "max_episode_steps": 3}
    assert all(e["steps"] <= 3 for e in report["episodes"])


def test_crl_eval_env_kwargs_as_typed_key_value_pairs(tmp_path):
    import doctest

    from crl_harness.commands import eval as eval_command

    assert doctest.testmod(eval_command).failed == 0
    assert parse_env_kwargs(["a=0.5", "b=true", "c=null", "d=[1, 2]", "e=x=y",
                                          "f=", "g=[1,"]) == {
        "a": 0.5, "b": True, "c": None, "d": [1, 2], "e": "x=y", "f": "", "g": "[1,"}
    out = tmp_path / "pairs"
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/MiniHackRoom-v0", "--episodes", "2",
                 "--env-kwargs", "variant=dark", "max_episode_steps=3", "--out", str(out),
                 "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["env_kwargs"] == {"variant": "dark", "max_episode_steps": 3}
    assert all(e["steps"] <= 3 for e in report["episodes"])


def test_hardening_crl_eval_sampling_flags_out_of_range_are_one_line(tmp_path, capsys):
    from crl_harness.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")  # a context of 4096 tokens
    for flags, message in ((["--temperature", "nan"], "--temperature must be a finite number"),
                           (["--temperature", "inf"], "--temperature must be a finite number"),
                           (["--top-p", "nan"], "--top-p must be a finite number"),
                           (["--top-p", "0"], "--top-p must be > 0"),
                           (["--max-new-tokens", "100000"], "--max-new-tokens must be between")):
        assert main(["eval", "--agent", f"hf:{model}", "--envs", "CRL/Sokoban-v0", "--episodes",
                     "1", "--out", str(tmp_path / "out"), "--no-progress", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, flags
    assert not (tmp_path / "out" / "results.jsonl").exists()


@pytest.mark.parametrize("value", ["0", "-3", "2.5", '"6"', "1e9", "true", "1000000"])
def test_hardening_crl_eval_max_episode_steps_must_be_a_whole_positive_number(tmp_path, capsys,
                                                                               value):
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--env-kwargs", f"max_episode_steps={value}", "--out", str(tmp_path),
                 "--no-progress"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "max_episode_steps must be a whole number of steps in 1..100000" in line


def test_hardening_crl_eval_dtype_runs_the_model_in_it_and_refuses_others(tmp_path, capsys):
    from crl_harness.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    args = ["eval", "--agent", f"hf:{model}", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
            "--max-new-tokens", "4", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16"]) == 0
    assert "model on cpu (bfloat16)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--out", str(tmp_path / "bad"), "--dtype", "float8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--dtype" in err and "invalid choice" in err and "Traceback" not in err


def _eval(out, *flags: str) -> int:
    return main(["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--seeds", "0-3",
                 "--out", str(out), "--no-progress", *flags])


def test_crl_eval_writes_one_transcript_line_per_episode(tmp_path):
    out = tmp_path / "ev"
    assert _eval(out) == 0
    lines = (out / "transcripts.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert sorted(r["seed"] for r in records) == [0, 1, 2, 3]
    first = records[0]
    assert first["env_id"] == "CRL/Sokoban-v0" and first["agent"] == "scripted" and first["won"]
    assert len(first["turns"]) == first["steps"] > 0
    turn = first["turns"][0]
    assert turn["observation"] and turn["reply"] == turn["action"] and turn["action_valid"]
    assert first["turns"][-1]["reward"] == 1.0 and first["final_observation"]
    assert json.loads((out / "eval.json").read_text())["seeds"] == [0, 1, 2, 3]


def test_crl_eval_resume_plays_only_the_missing_episodes(tmp_path, capsys):
    out = tmp_path / "ev"
    assert _eval(out) == 0
    # An interrupted eval: two episodes recorded, no report yet.
    for name in ("results.jsonl", "transcripts.jsonl"):
        lines = (out / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (out / name).write_text("".join(lines[:2]), encoding="utf-8")
    done = {a.seed for a in read_attempts(out / "results.jsonl")}
    (out / "report.json").unlink()
    capsys.readouterr()
    assert _eval(out, "--resume") == 0
    assert "2 episode(s) done, 2 to play" in capsys.readouterr().out
    attempts = read_attempts(out / "results.jsonl")
    assert sorted(a.seed for a in attempts) == [0, 1, 2, 3]
    records = [json.loads(line) for line in
               (out / "transcripts.jsonl").read_text(encoding="utf-8").splitlines()]
    assert {r["seed"] for r in records[2:]} == {0, 1, 2, 3} - done and len(records) == 4
    report = json.loads((out / "report.json").read_text())
    assert report["envs"][0]["episodes"] == 4 and report["envs"][0]["successes"] == 4
    # Nothing left to play: a second resume plays nothing and rewrites the report.
    assert _eval(out, "--resume") == 0
    assert len(read_attempts(out / "results.jsonl")) == 4


def test_crl_eval_resume_hardening_bad_folders_are_one_clear_error(tmp_path, capsys):
    def fails(expected: str, argv: list[str]) -> None:
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert re.search(expected, err) and err.count("\n") == 1, err

    out = tmp_path / "ev"
    argv = ["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0", "--seeds", "0-3",
            "--out", str(out), "--no-progress"]
    fails("does not exist, so it is no crl eval folder", [*argv, "--resume"])
    assert not out.exists()
    fails("--resume needs --out", ["eval", "--agent", "scripted", "--envs", "CRL/Sokoban-v0",
                                   "--resume"])
    out.mkdir()
    fails("holds no eval.json", [*argv, "--resume"])
    assert main(argv) == 0
    fails("already exists.*--resume", argv)
    fails(r"other settings \(seeds: \[0, 1, 2, 3\] there", [*argv[:-4], "0-5", *argv[-3:],
                                                             "--resume"])
    (out / "eval.json").write_text("[1]", encoding="utf-8")
    fails("not an eval's settings", [*argv, "--resume"])


def _lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _records(path) -> list[dict]:
    return [json.loads(line) for line in _lines(path)]  # every line whole JSON, or it raises


def test_crl_eval_resume_hardening_after_a_torn_last_line(tmp_path, capsys):
    """A crash mid-append leaves half a line without its newline; the next append once went
    straight after it, so both files got an unparseable line and the episode was lost."""
    out = tmp_path / "ev"
    assert _eval(out) == 0
    for name in ("results.jsonl", "transcripts.jsonl"):
        lines = _lines(out / name)
        (out / name).write_bytes(b"".join(lines[:2]) + lines[2][:len(lines[2]) // 2])
    assert _eval(out, "--resume") == 0
    assert "cut the unfinished last line" in capsys.readouterr().out
    assert sorted(a.seed for a in read_attempts(out / "results.jsonl")) == [0, 1, 2, 3]
    assert sorted(r["seed"] for r in _records(out / "results.jsonl")) == [0, 1, 2, 3]
    assert sorted(r["seed"] for r in _records(out / "transcripts.jsonl")) == [0, 1, 2, 3]


def test_crl_eval_hardening_one_eval_at_a_time_writes_a_folder(tmp_path, capsys):
    """Two evals on one folder both played its missing episodes (1,990 attempts for 1,000
    pairs); the second is now refused in one line, and leaves the first one's files alone."""
    from crl_harness.eval.folder import lock_folder

    out = tmp_path / "ev"
    assert _eval(out) == 0
    (out / "results.jsonl").write_bytes(b"".join(_lines(out / "results.jsonl")[:2]))
    held = lock_folder(out)  # another eval's open file: flock refuses a second one
    try:
        for flags in (("--resume",), ()):
            capsys.readouterr()
            assert _eval(out, *flags) == 2
            err = capsys.readouterr().err
            assert "is in use by another crl eval (pid" in err and err.count("\n") == 1, err
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        (fresh / "eval.json").write_text("{}", encoding="utf-8")  # the holder's settings
        held_fresh = lock_folder(fresh)
        assert _eval(fresh) == 2 and (fresh / "eval.json").read_text() == "{}"
        held_fresh.close()
    finally:
        held.close()
    assert len(read_attempts(out / "results.jsonl")) == 2
    assert _eval(out, "--resume") == 0  # the lock went with its holder
    assert len(read_attempts(out / "results.jsonl")) == 4


@pytest.mark.parametrize("damage", [
    pytest.param(lambda r: r.replace(b'"generated_tokens": 0', b'"generated_tokens": null', 1),
                 id="tokens-null"),
    pytest.param(lambda r: r.replace(b'"reward": 1.0', b'"reward": "1"', 1), id="reward-text"),
    pytest.param(lambda r: r.replace(b'"steps": ', b'"steps": -', 1), id="steps-negative"),
    pytest.param(lambda r: r.replace(b'"truncated": false', b'"truncated": 0', 1),
                 id="truncated-number"),
    pytest.param(lambda r: r.replace(b'"model": "scripted"', b'"model": "\xff\xfe"', 1),
                 id="not-utf8"),
    pytest.param(lambda r: b"[1, 2]\n" + r, id="a-list"),
])
def test_crl_eval_resume_hardening_damaged_results_are_one_line(tmp_path, capsys, damage):
    out = tmp_path / "ev"
    assert _eval(out) == 0
    results = (out / "results.jsonl").read_bytes()
    (out / "results.jsonl").write_bytes(damage(results))
    assert (out / "results.jsonl").read_bytes() != results
    capsys.readouterr()
    assert _eval(out, "--resume") == 2
    err = capsys.readouterr().err
    assert "results.jsonl" in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_crl_eval_resume_hardening_settings_not_utf8_are_one_line(tmp_path, capsys):
    out = tmp_path / "ev"
    assert _eval(out) == 0
    (out / "eval.json").write_bytes(b'{"agent": "\xff"}')
    capsys.readouterr()
    assert _eval(out, "--resume") == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "eval.json" in err and err.count("\n") == 1, err


class Killed(BaseException):
    """A kill -9 stand-in: nothing after it runs."""


def test_crl_eval_resume_hardening_a_kill_between_the_appends_loses_no_transcript(
        tmp_path, monkeypatch):
    """Killed between an episode's two appends: after --resume every attempt has its one
    transcript (the attempt is appended last, so the episode is played again)."""
    import crl_harness.eval.loop as loop

    appends: list[str] = []

    def counted(name, append):
        def wrapper(path, record):
            appends.append(name)
            if len(appends) == 6:  # the third episode's second append
                raise Killed
            append(path, record)
        return wrapper

    monkeypatch.setattr(loop, "append_attempt", counted("attempt", loop.append_attempt))
    monkeypatch.setattr(loop, "append_transcript", counted("transcript", loop.append_transcript))
    out = tmp_path / "ev"
    with pytest.raises(Killed):
        _eval(out)
    monkeypatch.undo()
    assert _eval(out, "--resume") == 0
    attempts = sorted(a.seed for a in read_attempts(out / "results.jsonl"))
    transcripts = sorted(r["seed"] for r in _records(out / "transcripts.jsonl"))
    assert attempts == transcripts == [0, 1, 2, 3]


def test_hardening_crl_eval_counts_errors_apart_and_reports_the_envs_rewards(tmp_path, capsys,
                                                                           without_module):
    """The progress bar counts wins among the episodes played and the errored ones apart (it said
    "4/4 wins 2" with two never played), and a reply out of format costs no reward in crl eval:
    the rewards are the env's (1 or 0), the training format penalty is not applied."""
    pytest.importorskip("transformers")
    from crl_harness.models.tiny import build_tiny_model

    without_module("SWEBench", "swebench")
    assert main(["eval", "--agent", "scripted", "--envs", "CRL/SWEBenchToy-v0,CRL/Sokoban-v0",
                 "--episodes", "2", "--out", str(tmp_path / "scripted")]) == 0
    assert "4/4 wins 2/2 played, errors 2" in capsys.readouterr().out

    model = build_tiny_model(tmp_path / "tiny")  # it never writes the answer format
    out = tmp_path / "ev"
    assert main(["eval", "--agent", f"hf:{model}", "--envs", "CRL/Sokoban-v0", "--episodes", "1",
                 "--max-new-tokens", "4", "--history", "1", "--out", str(out)]) == 0
    assert "1/1 wins 0/1 played" in capsys.readouterr().out
    [sokoban] = [json.loads(line) for line in (out / "transcripts.jsonl").read_text().splitlines()]
    assert [t["format_ok"] for t in sokoban["turns"]] == [False] * 30  # the step limit
    assert [t["reward"] for t in sokoban["turns"]] == [0.0] * 30 and sokoban["reward"] == 0.0
