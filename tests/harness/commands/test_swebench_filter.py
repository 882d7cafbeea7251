"""``crl swe filter`` over a crl-results/1 file, and the results format's reader and writer."""

from __future__ import annotations

import json

import pytest

from crl_harness.cli import main
from crl_harness.results import (
    Attempt,
    ResultsFormatError,
    TaskTally,
    append_attempt,
    read_attempts,
    tally,
)


def write_results(path, wins_by_task: dict[str, int], attempts: int = 16) -> None:
    for task_id, wins in wins_by_task.items():
        for index in range(attempts):
            append_attempt(path, Attempt(task_id=task_id, won=index < wins, reward=float(index < wins),
                                         seed=index, env_id="CRL/SWEBench-v0"))


def test_attempts_round_trip_and_tally(tmp_path):
    path = tmp_path / "results.jsonl"
    append_attempt(path, Attempt(task_id="a", won=True, steps=12, extra={"patch": "diff"}))
    append_attempt(path, Attempt(task_id="a", won=False))
    append_attempt(path, Attempt(task_id="b", won=False))
    attempts = read_attempts(path)
    assert attempts[0].steps == 12 and attempts[0].extra == {"patch": "diff"}
    assert json.loads(path.read_text().splitlines()[0])["patch"] == "diff"
    assert tally(attempts) == {"a": TaskTally(2, 1), "b": TaskTally(1, 0)}


def test_torn_last_line_is_skipped_but_bad_lines_are_named(tmp_path):
    path = tmp_path / "results.jsonl"
    append_attempt(path, Attempt(task_id="a", won=True))
    with open(path, "a") as handle:
        handle.write('{"task_id": "a", "wo')  # a crash mid-write
    assert len(read_attempts(path)) == 1
    path.write_text('{"task_id": "a"}\n{"task_id": "a", "won": true}\n')
    with pytest.raises(ResultsFormatError, match=r"results.jsonl:1: .*lacks won"):
        read_attempts(path)
    path.write_text('{"task_id": "a", "won": "false"}\n{"task_id": "a", "won": true}\n')
    with pytest.raises(ResultsFormatError, match="won must be true or false"):
        read_attempts(path)


def test_filter_keeps_tasks_strictly_between_thresholds(tmp_path, capsys):
    results = tmp_path / "results.jsonl"
    # 0/16 and 13/16 (81%) are out; 1/16 and 12/16 (75%) in; "short" has too few attempts.
    write_results(results, {"never": 0, "once": 1, "most": 12, "nearly": 13})
    write_results(results, {"short": 1}, attempts=3)
    out = tmp_path / "kept.txt"
    assert main(["swe", "filter", str(results), "--min-attempts", "16", "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0].startswith("# crl swe filter: 2 of 5 tasks") and lines[1:] == ["most", "once"]
    assert "1 had fewer" in lines[0]
    assert main(["swe", "filter", str(results), "--max-rate", "0.85"]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["most", "nearly", "once", "short"]


def test_filter_output_is_a_task_list_for_the_env(tmp_path):
    from crl_envs.swebench.data import read_task_ids

    results = tmp_path / "results.jsonl"
    write_results(results, {"django__django-11099": 4, "astropy__astropy-12907": 16})
    out = tmp_path / "kept.txt"
    main(["swe", "filter", str(results), "--out", str(out)])
    assert read_task_ids(out) == ["django__django-11099"]


def test_filter_rejects_bad_options_and_missing_file(tmp_path, capsys):
    assert main(["swe", "filter", str(tmp_path / "none.jsonl")]) == 2
    assert "No results file" in capsys.readouterr().err
    assert main(["swe", "filter", str(tmp_path / "none.jsonl"), "--min-rate", "0.9"]) == 2
    assert "--min-rate < --max-rate" in capsys.readouterr().err


@pytest.mark.parametrize("attempts", ["-5", "0"])
def test_hardening_min_attempts_below_one_is_refused(tmp_path, capsys, attempts):
    results = tmp_path / "results.jsonl"
    write_results(results, {"once": 1})
    assert main(["swe", "filter", str(results), "--min-attempts", attempts]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"crl swe filter: --min-attempts must be >= 1, got {attempts}."
    assert captured.out == ""
