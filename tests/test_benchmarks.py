"""The benchmark scripts' own flags: bad values stop with a usage error before anything trains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EFFICACY = Path(__file__).resolve().parents[1] / "benchmarks" / "efficacy.py"
PILOT = Path(__file__).resolve().parents[1] / "benchmarks" / "pilot_curve.py"
WARM = Path(__file__).resolve().parents[1] / "benchmarks" / "warmstart_heldout.py"
QUALITY = Path(__file__).resolve().parents[1] / "benchmarks" / "extractor_quality.py"
LATENCY = Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_step_latency.py"
TRANSFER = Path(__file__).resolve().parents[1] / "benchmarks" / "transfer_ceiling.py"
TEST_TIME = Path(__file__).resolve().parents[1] / "benchmarks" / "test_time_check.py"


@pytest.mark.parametrize(("script", "flags", "message"), [
    (EFFICACY, ["--jobs", "0"], "--jobs must be in 1..16"),
    (EFFICACY, ["--jobs", "17"], "--jobs must be in 1..16"),
    (EFFICACY, ["--repeats", "0"], "--repeats must be in 1..20"),
    (EFFICACY, ["--steps", "0"], "--steps in 1..10000"),
    (EFFICACY, ["--arms", "grpo"], "invalid choice"),
    (EFFICACY, ["--eval-levels", "0"], "--eval-levels must be in 1..10000"),
    (EFFICACY, ["--eval-levels", "10001"], "--eval-levels must be in 1..10000"),
    (EFFICACY, ["--set", "actor.no_such_key=1"], "no_such_key"),
    (EFFICACY, ["--extractor-quality", "-1"], "--extractor-quality must be in 4..300"),
    (EFFICACY, ["--extractor-quality", "3"], "--extractor-quality must be in 4..300"),
    (EFFICACY, ["--extractor-quality", "301"], "--extractor-quality must be in 4..300"),
    (PILOT, ["--steps", "0"], "--steps must be in 1..1000"),
    (PILOT, ["--levels", "0"], "--levels in 1..10000"),
    (PILOT, ["--steps", "4", "--eval-at", "5"], "every --eval-at step must be in 1..--steps (4)"),
    (PILOT, ["--eval-at", "0"], "every --eval-at step must be in 1..--steps"),
    (PILOT, ["--arm", "grpo"], "invalid choice"),
    (PILOT, ["--set", "actor.no_such_key=1"], "no_such_key"),
    (WARM, ["--levels", "0"], "--levels must be in 1..10000"),
    (WARM, ["--levels", "10001"], "--levels must be in 1..10000"),
    (WARM, ["--config", "no-such-config"], "no-such-config"),
    (QUALITY, ["--dtype", "int8"], "invalid choice: 'int8'"),
    (QUALITY, ["--episodes", "3"], "--episodes must be in 4..300"),
    (QUALITY, ["--episodes", "301"], "--episodes must be in 4..300"),
    (QUALITY, ["--replay-levels", "-1"], "--replay-levels must be in 0..64"),
    (QUALITY, ["--replay-levels", "65"], "--replay-levels must be in 0..64"),
    (QUALITY, ["--actor-episodes", "-1"], "--actor-episodes must be in 0..512"),
    (QUALITY, ["--actor-episodes", "513"], "--actor-episodes must be in 0..512"),
    (QUALITY, ["--merge-cases", "257"], "--merge-cases must be in 0..256"),
    (QUALITY, ["--merge-cases", "4"], "--merge-cases folds a key's lessons"),
    (QUALITY, ["--set", "extractor.rollout_engine=tgi"], "extractor.rollout_engine"),
    (LATENCY, ["--batches", "0"], "--batches takes 1..8 sizes, each in 1..256"),
    (LATENCY, ["--batches", *["1"] * 9], "--batches takes 1..8 sizes, each in 1..256"),
    (LATENCY, ["--context", "5000"], "--context must be in 16..4096"),
    (LATENCY, ["--new-tokens", "0"], "--new-tokens must be in 1..512"),
    (LATENCY, ["--repeats", "11"], "--repeats must be in 1..10"),
    (LATENCY, ["--batches", "256", "--context", "4096"], "must fit actor.kv_cache_tokens"),
    (LATENCY, ["--set", "actor.no_such_key=1"], "no_such_key"),
    (TRANSFER, ["--levels", "1"], "--levels must be in 2..1000"),
    (TRANSFER, ["--levels", "1001"], "--levels must be in 2..1000"),
    (TRANSFER, ["--samples", "-1"], "--samples must be in 0..16"),
    (TRANSFER, ["--samples", "17"], "--samples must be in 0..16"),
    (TRANSFER, ["--offset", "-1"], "--offset must be in 0.."),
    (TRANSFER, ["--set", "actor.no_such_key=1"], "no_such_key"),
    (TEST_TIME, ["--levels", "1"], "--levels must be in 2..4096"),
    (TEST_TIME, ["--attempts", "17"], "--attempts must be in 2..16"),
    (TEST_TIME, ["--rounds", "0"], "--rounds must be in 1..8"),
    (TEST_TIME, ["--rounds", "9"], "--rounds must be in 1..8"),
    (TEST_TIME, ["--set", "actor.no_such_key=1"], "no_such_key"),
])
def test_hardening_benchmark_flags_stop_with_usage_before_writing(tmp_path, script, flags,
                                                                 message):
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "out"), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "out").exists()  # stopped before writing anything


@pytest.mark.parametrize(("script", "flags", "message"), [
    ("actor_update_bench.py", ["--steps", "0"], "--steps and --repeats must be in 1..20"),
    ("actor_update_bench.py", ["--repeats", "21"], "--steps and --repeats must be in 1..20"),
    ("actor_update_bench.py", ["--set", "actor.no_such_key=1"], "no_such_key"),
    ("actor_update_bench.py", ["--config", "no-such-config"], "no-such-config"),
    ("actor_update_bench.py", ["--compare", "speed"], "invalid choice: 'speed'"),
    ("helper_thread_bench.py", ["--repeats", "0"], "--repeats must be in 1..10"),
    ("helper_thread_bench.py", ["--repeats", "11"], "--repeats must be in 1..10"),
    ("helper_thread_bench.py", ["--set", "actor.no_such_key=1"], "no_such_key"),
    ("helper_thread_bench.py", ["--config", "no-such-config"], "no-such-config"),
    ("helper_thread_bench.py", ["--set", "arm=none"],
     "arm none has no extractor to run in a helper thread"),
    ("key_coverage.py", ["--levels", "0"], "--levels must be in 1.."),
    ("key_coverage.py", ["--levels", "10000000"], "--levels must be in 1.."),
    ("key_coverage.py", ["--steps", "0"], "--steps must be in 1..1000"),
    ("key_coverage.py", ["--set", "tasks.no_such_key=1"], "no_such_key"),
    ("key_coverage.py", ["--config", "webshop"], "has no exact retrieval key"),
    ("key_coverage.py", ["--print-pool", "0"], "--print-pool must be in 1..1000"),
    ("key_coverage.py", ["--print-pool", "8", "--scan", "0"], "--scan must be in 1..100000"),
    ("key_coverage.py", ["--print-pool", "8", "--per-key", "0"], "must be at least 1"),
    ("key_coverage.py", ["--print-pool", "50", "--scan", "20", "--per-key", "1"],
     "only "),
])
def test_hardening_benchmark_flags_are_usage_errors(script, flags, message):
    """The benchmarks that write no ``--out``: a bad flag stops with a usage line."""
    done = subprocess.run([sys.executable, str(EFFICACY.parent / script), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr


@pytest.mark.parametrize(("script", "writes_out"), [
    (EFFICACY, True), (PILOT, True), (QUALITY, True), (LATENCY, True), (TRANSFER, True),
    (TEST_TIME, True), (EFFICACY.parent / "actor_update_bench.py", False),
    (EFFICACY.parent / "helper_thread_bench.py", False), (EFFICACY.parent / "key_coverage.py", False),
])
@pytest.mark.parametrize("form", ["repeated", "listed"])
def test_hardening_every_set_override_reaches_the_config(tmp_path, script, writes_out, form):
    """``--set A --set B`` and ``--set A B`` both apply A: a repeated ``--set`` once kept only
    its last overrides, so a run silently trained another config than the command named."""
    first, last = "actor.no_such_key=1", "actor.second_missing=1"
    flags = ["--set", first, "--set", last] if form == "repeated" else ["--set", first, last]
    out = ["--out", str(tmp_path / "out")] if writes_out else []
    done = subprocess.run([sys.executable, str(script), *out, *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no_such_key" in done.stderr  # the first override was read, not dropped


def test_hardening_every_benchmark_set_flag_takes_repeats_and_lists():
    """Every benchmark declares ``--set`` one way, so no script drops a repeated one."""
    declared = {p.name: line.strip() for p in EFFICACY.parent.glob("*.py")
                for line in p.read_text().splitlines() if 'add_argument("--set"' in line}
    assert len(declared) >= 15
    assert {name: line for name, line in declared.items()
            if 'action="extend", nargs="+"' not in line} == {}


def test_hardening_efficacy_sigterm_stops_the_run_it_spawned(tmp_path):
    """``timeout`` or ``kill`` sends SIGTERM to efficacy.py alone: the run it is training (a
    process of its own, gigabytes with a real model) stops with it instead of training on."""
    import signal
    import time

    import psutil

    from crl_harness.models.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    parent = subprocess.Popen(
        [sys.executable, str(EFFICACY), "--out", str(tmp_path / "out"), "--steps", "10000",
         "--repeats", "1", "--arms", "none", "--eval-levels", "1", "--set",
         f"actor.model=hf:{tiny}", "actor.lora.init_from=null", "actor.dtype=float32",
         "tasks.group_size=2", "tasks.guided_per_group=1", "tasks.groups_per_step=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = []
    try:
        # the run is another process: its first metrics line is the sign it trains, polled
        deadline = time.monotonic() + 120
        while not (tmp_path / "out" / "none-seed0" / "metrics.jsonl").exists():
            assert parent.poll() is None, parent.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the run never trained a step"
            time.sleep(0.5)
        runs.extend(psutil.Process(parent.pid).children(recursive=True))
        assert runs
        parent.send_signal(signal.SIGTERM)
        _, stderr = parent.communicate(timeout=60)
        assert parent.returncode == 1
        assert "efficacy: stopped by signal" in stderr and "Traceback" not in stderr
        gone, alive = psutil.wait_procs(runs, timeout=30)
        assert not alive, f"still running: {alive}"
    finally:  # nothing of this test outlives it, whatever failed
        parent.kill()
        for process in runs:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


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


def test_retrieval_oracle_lessons_are_the_warm_starts_route_entries(monkeypatch):
    """The oracle lessons of retrieval_oracle.py and experience_ceiling.py: each level's entry as
    the warm start shows it (they were once built from the entry as if it were an observation)."""
    from crl_harness.config import load_config

    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    from retrieval_oracle import lessons, oracle_play

    cfg = load_config("cpu-demo")
    found = lessons(cfg.tasks.envs[0].id, [0, 1, 2], oracle_play(cfg))
    assert found
    for seed, entry in found.items():
        assert entry.id == f"route-{seed}" and entry.title.startswith("Winning moves from x=")
        assert entry.content.startswith("from the start, play ")


@pytest.mark.parametrize(("native", "dtype"), [(True, "bfloat16"), (False, "float32")])
def test_efficacy_runs_cpu_demo_in_float32_where_the_cpu_emulates_bf16(monkeypatch, tmp_path,
                                                                       native, dtype):
    """cpu-demo's ``bfloat16-if-native``: an emulated bf16 made a cpu-demo step 4x slower than
    it is in bf16 natively; an explicit ``--set`` still wins."""
    from crl_harness.models import hf_loading

    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    import efficacy

    monkeypatch.setattr(hf_loading, "cpu_computes_bf16", lambda: native)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cfg = efficacy.run_config("cpu-demo", "none", None, 0, 1, tmp_path, [])
    assert cfg.actor.dtype == cfg.extractor.dtype == dtype
    forced = efficacy.run_config("cpu-demo", "none", None, 0, 1, tmp_path,
                                 ["actor.dtype=bfloat16"])
    assert forced.actor.dtype == "bfloat16"


def test_hardening_efficacy_reuse_reads_a_finished_run_of_the_same_config_only(monkeypatch,
                                                                              tmp_path, capsys):
    """``--reuse``: a run folder with heldout.json and this config is read, not trained again;
    without heldout.json it is trained; a finished run of another config is a usage error that
    names the setting, never silently pooled."""
    import argparse
    import json

    from crl_harness.config import config_to_dict

    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    import efficacy

    parser = argparse.ArgumentParser(prog="efficacy.py")
    cfg = efficacy.run_config("cpu-demo", "none", None, 0, 6, tmp_path, [])
    run_dir = Path(cfg.run.output_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(cfg)))
    assert not efficacy.finished_run(cfg, parser)  # trained, not finished: no heldout.json
    (run_dir / "heldout.json").write_text(json.dumps({"outcomes": {}}))
    assert efficacy.finished_run(cfg, parser)
    # the run stores the engine `auto` chose where it trained: the same command reuses it
    trained = config_to_dict(cfg)
    trained["actor"]["rollout_engine"] = trained["extractor"]["rollout_engine"] = "vllm"
    (run_dir / "config.json").write_text(json.dumps(trained))
    assert cfg.actor.rollout_engine == "auto" and efficacy.finished_run(cfg, parser)
    pinned = efficacy.run_config("cpu-demo", "none", None, 0, 6, tmp_path,
                                 ["actor.rollout_engine=hf"])
    with pytest.raises(SystemExit):
        efficacy.finished_run(pinned, parser)
    assert "(actor.rollout_engine: 'vllm' there, 'hf' now)" in capsys.readouterr().err
    other = efficacy.run_config("cpu-demo", "none", None, 0, 4, tmp_path, [])
    with pytest.raises(SystemExit):
        efficacy.finished_run(other, parser)
    assert "holds a run of another config (run.steps: 6 there, 4 now)" in capsys.readouterr().err
    # moved into another --out, and for arm none another extractor or merge pass: the same run
    moved = dict(trained, run={**trained["run"], "output_dir": "/elsewhere/none-seed0"},
                 extractor={**trained["extractor"], "temperature": 0.3},
                 experience={**trained["experience"], "merge_every": 2})
    (run_dir / "config.json").write_text(json.dumps(moved))
    assert efficacy.finished_run(cfg, parser)
    coevolve = efficacy.run_config("cpu-demo", "co-evolve", None, 0, 6, tmp_path, [])
    coevolve_dir = Path(coevolve.run.output_dir)
    coevolve_dir.mkdir(parents=True)
    (coevolve_dir / "heldout.json").write_text(json.dumps({"outcomes": {}}))
    saved = config_to_dict(coevolve)
    (coevolve_dir / "config.json").write_text(json.dumps(
        dict(saved, extractor={**saved["extractor"], "temperature": 0.3})))
    with pytest.raises(SystemExit):  # an arm that trains its extractor: another run
        efficacy.finished_run(coevolve, parser)
    assert "(extractor.temperature: 0.3 there, 0.7 now)" in capsys.readouterr().err
    (coevolve_dir / "config.json").write_text(json.dumps(
        dict(saved, experience={**saved["experience"], "merge_every": 2})))
    with pytest.raises(SystemExit):  # and merges its bank otherwise: another run
        efficacy.finished_run(coevolve, parser)
    assert "(experience.merge_every: 2 there, 0 now)" in capsys.readouterr().err
    # made before a setting existed: reused while it holds its default, not once it is set
    older = config_to_dict(coevolve)
    del older["warmstart"]["extractor_init_from"]
    (coevolve_dir / "config.json").write_text(json.dumps(older))
    assert efficacy.finished_run(coevolve, parser)
    with pytest.raises(SystemExit):
        efficacy.finished_run(efficacy.run_config(
            "cpu-demo", "co-evolve", None, 0, 6, tmp_path,
            ["warmstart.extractor_init_from=assets/warmstart/cpu-demo/extractor"]), parser)
    assert "warmstart.extractor_init_from: None there" in capsys.readouterr().err
    (run_dir / "config.json").write_text("{not json")
    with pytest.raises(SystemExit):
        efficacy.finished_run(cfg, parser)
    assert "no readable config.json" in capsys.readouterr().err


@pytest.mark.parametrize("tamper, message", [
    ({"metrics.jsonl": ""}, "metrics.jsonl holds no step"),
    ({"metrics.jsonl": '{"step": 1, "success/all": "0.5", "episodes/all": 32}\n'},
     "metrics.jsonl record 1: success/all is not a number"),
    ({"heldout.json": '{"outcomes": {"level a": true}}'}, "heldout.json's levels are not"),
    ({"heldout.json": "[1, 2]"}, 'heldout.json is not {"outcomes"'),
    ({"heldout.json": "\udcff"}, "cannot be read"),
    ({"heldout.json": '{"outcomes": {"50000000": true, "50000001": false}, '
                      '"outcomes_with_bank": {"50000000": "yes"}}'},
     "outcomes_with_bank are not one true or false"),
    ({"heldout.json": '{"outcomes": {"50000000": true, "50000001": false}, '
                      '"handed_lessons": {"7": true}}'},
     "handed_lessons are not true or false for some of its held-out levels"),
    ({"heldout.json": '{"outcomes": {"50000000": true, "50000001": false}, '
                      '"handed_lessons": {"50000000": 1}}'},
     "handed_lessons are not true or false"),
    ({}, "heldout.json holds 2 held-out levels, not the 3 of --eval-levels; rerun with "
         "--eval-levels 2"),
])
def test_hardening_efficacy_reuse_refuses_a_tampered_run_folder_in_one_line(
        monkeypatch, tmp_path, capsys, tamper, message):
    """Emptied or edited files of a reused run, or another --eval-levels, used to end in a
    traceback after the warm start was evaluated (or compare the shared levels silently)."""
    import doctest
    import json
    import os

    from crl_harness.config import config_to_dict

    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    import efficacy
    import reused_runs

    assert doctest.testmod(reused_runs).failed == 0
    threads = f"run.torch_threads={max(1, os.cpu_count() or 1)}"  # as efficacy.py sets it
    cfg = efficacy.run_config("cpu-demo", "none", None, 0, 2, tmp_path, [threads])
    run_dir = Path(cfg.run.output_dir)
    run_dir.mkdir(parents=True)
    offset = cfg.tasks.heldout_offset
    files = {"config.json": json.dumps(config_to_dict(cfg)),
             "heldout.json": json.dumps({"outcomes": {str(offset): True,
                                                      str(offset + 1): False}}),
             "metrics.jsonl": '{"step": 1, "success/all": 0.5, "episodes/all": 32}\n', **tamper}
    for name, text in files.items():
        (run_dir / name).write_text(text, errors="surrogateescape")
    evaluated = []
    monkeypatch.setattr("crl_harness.eval.heldout.evaluate_levels", lambda *a, **k: evaluated.append(a))
    monkeypatch.setattr(sys, "argv", ["efficacy.py", "--reuse", "--out", str(tmp_path),
                                      "--arms", "none", "--repeats", "1", "--steps", "2",
                                      "--eval-levels", "2" if tamper else "3"])
    with pytest.raises(SystemExit) as stopped:
        efficacy.main()
    assert stopped.value.code == 2 and not evaluated
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("efficacy.py: error: --reuse: ") and message in err, err
    assert "Traceback" not in err


def test_efficacy_reuse_names_the_first_setting_that_differs(monkeypatch):
    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    import efficacy

    saved = {"run": {"steps": 6, "seed": 0}, "arm": "none"}
    assert efficacy._first_difference(saved, {"run": {"steps": 4, "seed": 0}, "arm": "none"}) \
        == "run.steps"
    assert efficacy._at(saved, "run.steps") == 6
    assert efficacy._first_difference(saved, saved) == "(the whole config)"


def test_bank_replay_plays_each_route_lesson_on_its_level(tmp_path, monkeypatch):
    """A lesson that reaches the stairs of training level 0 wins, one that walks away loses, a
    lesson in words is counted apart, levels without a lesson are named, and what retrieval
    hands each level is played there (real MiniHack)."""
    import json

    from crl_harness.config import config_to_dict, load_config
    from crl_harness.experience.bank import ExperienceBank

    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(
        load_config("cpu-demo", ["tasks.seeds=[0, 1, 2, 3]"]))))  # 4 of its pool
    script = EFFICACY.parent / "bank_replay.py"
    monkeypatch.syspath_prepend(str(script.parent))
    import bank_replay

    cfg = load_config(str(tmp_path / "config.json"), [])
    _, keys, _ = bank_replay.replay_bank(cfg, [])
    room = cfg.tasks.envs[0].id
    with ExperienceBank(tmp_path / "bank.sqlite") as bank:
        for moves in ("south", "south", "north, north"):  # level 0: the stairs 1 south
            bank.add(room, f"Winning moves from {keys[0]}", f"from the start, play {moves}.")
        bank.add(room, "Walls", "Avoid the walls.")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "4 entries of CRL/MiniHackRoom-v0, 1 not a route lesson" in done.stdout
    assert "  wins   x2   votes 0   south" in done.stdout
    assert "  loses  x1   votes 0   north, north" in done.stdout
    assert "route lessons: 2/3 entries win when played (1/2 distinct); levels with a lesson of " \
           "their own: 1/4" in done.stdout
    assert "none of its own" in done.stdout
    # what a guided episode is handed now (the exact key's floor, the default): level 0 its own
    # shortest lesson, the others nothing (not level 0's lesson)
    assert "level 0 retrieves own south: wins" in done.stdout
    assert "level 1 retrieves nothing" in done.stdout
    assert "levels handed their own lesson: 1/4, one that wins there: 1/4, nothing: 3/4" \
        in done.stdout
    no_floor = subprocess.run([sys.executable, str(script), str(tmp_path), "--set",
                               "experience.min_query_coverage=0"], capture_output=True, text=True,
                              timeout=300)
    assert no_floor.returncode == 0, no_floor.stderr
    assert "level 1 retrieves level 0's south: loses" in no_floor.stdout
    assert "levels handed their own lesson: 1/4, one that wins there: 1/4, nothing: 0/4" \
        in no_floor.stdout


def test_bank_replay_copies_the_bank_with_its_votes(monkeypatch):
    """The retrievals replayed rank a key's lessons as the run's bank does: by their votes too,
    so the in-memory copy keeps them (it once dropped them)."""
    from crl_harness.experience.entries import ExperienceEntry

    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    import bank_replay

    entries = [ExperienceEntry("a", "CRL/MiniHackRoom-v0", "Winning moves from k", "play south.",
                               "g1", votes=3),
               ExperienceEntry("b", "CRL/MiniHackRoom-v0", "Winning moves from k", "play north.",
                               "g2", votes=0)]
    bank, copies = bank_replay.memory_copy(entries)
    try:
        assert [(c.content, c.votes) for c in copies] == [("play south.", 3), ("play north.", 0)]
        assert [e.votes for e in bank.entries()] == [3, 0]
    finally:
        bank.close()


def test_bank_replay_key_levels_plays_a_keys_lessons_on_its_unseen_levels(tmp_path):
    """``--key-levels``: the oracle's own lesson of a key, stored in the bank, wins exactly as
    often as the oracle column says; a lesson that walks into the wall wins less; the totals
    add up over the key's levels (real MiniHack)."""
    import crl_envs
    from crl_harness.config import config_to_dict, load_config
    from crl_harness.experience.bank import ExperienceBank

    cfg = load_config("cpu-demo")
    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(cfg)))
    key = "x=36, y=9; in view: nothing notable"  # the dark room's corner: the most common start
    title, oracle = crl_envs.transferable_lesson(cfg.tasks.envs[0].id, key, 6)
    room = cfg.tasks.envs[0].id
    with ExperienceBank(tmp_path / "bank.sqlite") as bank:
        bank.add(room, title, oracle)
        bank.add(room, title, "from the start, play north, north, north, north. Once the staircase"
                              " down (>) is in view, stop and walk to it.")
    done = subprocess.run([sys.executable, str(EFFICACY.parent / "bank_replay.py"), str(tmp_path),
                           "--key-levels", "12", "--scan", "400"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith(f"key {key}:"))
    assert lines[head].startswith(f"key {key}: 12 unseen levels, oracle ")
    oracle_wins = int(lines[head].rsplit(" ", 1)[1])
    assert oracle_wins >= 8
    lessons = lines[head + 1:head + 3]
    wins = [int(line.split("/12")[0].split()[-1]) for line in lessons]
    assert oracle in lessons[0] and wins[0] == oracle_wins  # the bank's order
    assert wins[1] < oracle_wins  # north from the top row: into the wall
    handed = [w for line, w in zip(lessons, wins, strict=True) if line.split()[0] == "handed"]
    assert len(handed) == 1  # retrieval hands one of the two (by its own ranking)
    assert lines[-1] == (f"1 keys, 12 unseen levels of them: the lesson retrieval hands wins "
                         f"{handed[0]}, the key's best lesson {oracle_wins}, the oracle's "
                         f"lesson {oracle_wins}")


def test_hardening_bank_replay_wants_a_run_folder(tmp_path):
    from crl_harness.experience.bank import ExperienceBank

    def replay() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(EFFICACY.parent / "bank_replay.py"),
                               str(tmp_path)], capture_output=True, text=True, timeout=120)

    done = replay()
    assert done.returncode == 2 and "config.json is missing: give the folder of a training run" \
        in done.stderr
    (tmp_path / "config.json").write_text("{not json")
    (tmp_path / "bank.sqlite").write_text("not a database")
    done = replay()
    assert done.returncode == 2 and "not valid YAML" in done.stderr
    assert "Traceback" not in done.stderr
    from crl_harness.config import config_to_dict, load_config

    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(load_config("cpu-demo"))))
    done = replay()
    assert done.returncode == 2 and "is not an experience bank" in done.stderr
    assert "Traceback" not in done.stderr
    with ExperienceBank(tmp_path / "bank2.sqlite"):
        pass
    (tmp_path / "bank2.sqlite").replace(tmp_path / "bank.sqlite")
    for flags, message in ((["--set", "experience.min_query_coverage=2"], "must be in [0, 1]"),
                           (["--set", "experience.no_such_key=1"], "no_such_key"),
                           (["--key-levels", "0"], "--key-levels must be in 1..1000"),
                           (["--key-levels", "4", "--scan", "0"], "--scan must be in 1..")):
        done = subprocess.run([sys.executable, str(EFFICACY.parent / "bank_replay.py"),
                               str(tmp_path), *flags], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2 and message in done.stderr
        assert "Traceback" not in done.stderr


def test_gemm_rate_prints_every_shape_in_both_dtypes():
    done = subprocess.run([sys.executable, str(EFFICACY.parent / "gemm_rate.py"), "--threads",
                           "1", "--repeats", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()
            if line.startswith(("prefill ", "decode "))]
    assert len(rows) == 4 and all(float(r[-1]) > 0 and float(r[-2]) > 0 for r in rows)


@pytest.mark.parametrize("flags", [["--repeats", "0"], ["--threads", "-1"]])
def test_hardening_gemm_rate_flags(flags):
    done = subprocess.run([sys.executable, str(EFFICACY.parent / "gemm_rate.py"), *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--repeats must be in 1..1000 and --threads >= 0" in done.stderr


def test_extractor_quality_counts_each_taught_case_right_other_or_malformed(tmp_path):
    """The measure's verdicts on real held-out MiniHack episodes of every taught case: the
    taught answer is right, a vote where a return is taught is other, a broken answer is
    malformed (so a downvote of another level's route that misled an episode counts against
    the extractor)."""
    import importlib.util

    from crl_harness.config import load_config
    from crl_harness.models import HFBackend
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.warmstart.data import taught_answer

    spec = importlib.util.spec_from_file_location("extractor_quality", QUALITY)
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)
    backend = HFBackend(build_tiny_model(tmp_path / "tiny", hidden_size=64))
    cfg = load_config("cpu-demo", ["actor.max_new_tokens=80"])
    episodes = quality.heldout_episodes(cfg, backend, 12)
    cases = [quality.case_of(e) for e in episodes]
    assert {case: cases.count(case) for case in quality.CASES} == {
        "add": 3, "return": 2, "return, misled": 1, "upvote": 3, "downvote": 3}
    for episode, case in zip(episodes, cases, strict=True):
        prompt, ops = quality.taught(episode, cfg)
        shown = int(episode.advice is not None)
        assert ("[0] " in prompt) == bool(shown)
        assert quality.verdict(taught_answer(episode), shown, ops) == "right"
        assert quality.verdict("<answer>[{\"op\": \"add\"", shown, ops) == "malformed"
        if case == "return, misled":  # another level's route, followed and lost: not its fault
            wrong = '<answer>[{"op": "downvote", "target_idx": 0}]</answer>'
            assert quality.verdict(wrong, shown, ops) == "other"


def test_extractor_quality_actor_episodes_are_a_frozen_set_taught_as_the_warm_start_teaches(
        tmp_path):
    """``--actor-episodes``: the config's starting actor plays held-out levels past the taught
    cases' and the replay levels, shown nothing; the same actor and seed give the same
    transcripts (the fingerprint), another seed other ones; a won episode is taught to add the
    key's lesson (``extractor_lesson`` ``key``), a lost one to return."""
    import importlib.util

    from crl_harness.config import load_config
    from crl_harness.models.tiny import build_tiny_model
    from crl_harness.warmstart.data import taught_answer

    spec = importlib.util.spec_from_file_location("extractor_quality", QUALITY)
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)
    tiny = build_tiny_model(tmp_path / "tiny", hidden_size=64)
    settings = [f"actor.model=hf:{tiny}", "actor.lora.enabled=false", "actor.lora.init_from=null",
                "actor.rollout_engine=hf",
                "actor.max_new_tokens=8", "warmstart.extractor_lesson=key"]
    cfg = load_config("cpu-demo", settings)
    episodes, fingerprint = quality.actor_episodes(cfg, 3, "float32")
    again, same = quality.actor_episodes(cfg, 3, "float32")
    _, other = quality.actor_episodes(load_config("cpu-demo", [*settings, "run.seed=1"]), 3,
                                      "float32")
    assert fingerprint == same != other
    start = cfg.tasks.heldout_offset + quality.ACTOR_SEED_OFFSET
    assert [e.trajectory.seed for e in episodes] == [start, start + 1, start + 2]
    for episode in episodes:
        assert episode.advice is None and episode.trajectory.turns
        assert "## Lessons the agent was given for this episode (numbered)\n(none)" in \
            quality.taught(episode, cfg)[0]
        # the tiny actor loses; had it won, the answer would add the key's lesson
        assert taught_answer(episode) == '<answer>[{"op": "return"}]</answer>'
        assert quality.case_of(episode) == "return"
        episode.trajectory.won = True
        assert quality.case_of(episode) == "add"
        assert episode.own.title in taught_answer(episode)
        assert episode.own.content in taught_answer(episode)


def test_extractor_quality_merge_cases_count_folds_right_other_or_malformed():
    """``--merge-cases``: chunks in the manager's merge prompt; an extractor that always
    returns is right on the chunks of distinct keys and other on the ones to fold, a broken
    answer malformed."""
    import importlib.util
    from types import SimpleNamespace

    from crl_harness.config import load_config

    spec = importlib.util.spec_from_file_location("extractor_quality", QUALITY)
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)

    class Answers:
        def generate(self, prompts, temperature, **_):
            assert all("## Lessons (numbered)\n[0] Winning moves from" in p[0]["content"]
                       for p in prompts)
            text = '<answer>[{"op": "return"}]</answer>' if temperature == 0 else "<answer>["
            return [SimpleNamespace(text=text) for _ in prompts]

    cfg = load_config("cpu-demo", ["warmstart.extractor_lesson=key"])
    results = quality.ask_merges(cfg, Answers(), 8, 1, replay_levels=2)
    greedy, sampled = (results[label]["counts"] for label in ("greedy", "T=0.7"))
    assert greedy == {"merge": {"right": 0, "other": 6, "malformed": 0},
                      "merge: return": {"right": 2, "other": 0, "malformed": 0}}
    assert sampled["merge"]["malformed"] == 6 and sampled["merge: return"]["malformed"] == 2
    # folded into nothing: the six keys' levels are lost where the oracle's lesson wins some
    lost = results["merge replay"]
    assert (lost["cases"], lost["unread"], lost["extractor_wins"]) == (6, 6, 0)
    assert lost["oracle_wins"] > 0

    # the taught answers (the same chunks: the same levels and seed) replay as the oracle's
    import random

    from crl_harness.experience.manager_config import ManagerConfig
    from crl_harness.warmstart.merges import merge_cases, merge_prompt, taught_merge

    start = cfg.tasks.heldout_offset + quality.REPLAY_SEED_OFFSET
    env = cfg.tasks.envs[0]
    taught = {merge_prompt(c): taught_merge(c) for c in merge_cases(
        env.id, range(start, start + quality.REPLAY_SCAN), 8,
        rng=random.Random(cfg.tasks.heldout_offset), chunk=ManagerConfig().merge_chunk,
        env_kwargs=dict(env.kwargs))}

    class Taught:
        def generate(self, prompts, **_):
            return [SimpleNamespace(text=taught[p[0]["content"]]) for p in prompts]

    results = quality.ask_merges(cfg, Taught(), 8, 0, replay_levels=2)
    assert results["greedy"]["counts"]["merge"] == {"right": 6, "other": 0, "malformed": 0}
    same = results["merge replay"]
    assert same["unread"] == 0 and same["extractor_wins"] == same["oracle_wins"] == \
        lost["oracle_wins"]


def test_extractor_quality_replays_added_lessons_on_unseen_levels_of_their_key():
    """An added lesson is replayed without a model on unseen levels of the episode's key, beside
    the oracle's transferable lesson of that key: the oracle's own text wins as often as the
    oracle, an answer that adds nothing loses every level, a wrong sweep loses more."""
    import importlib.util

    import crl_envs
    from crl_harness.config import load_config
    from crl_harness.training.lesson_replay import LessonReplay

    spec = importlib.util.spec_from_file_location("extractor_quality", QUALITY)
    quality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(quality)
    cfg = load_config("cpu-demo")
    env = cfg.tasks.envs[0]
    key = "x=37, y=11; in view: nothing notable"
    [levels] = quality.levels_of_keys(cfg, {key}, 4).values()
    assert len(levels) == 4 and min(levels) >= cfg.tasks.heldout_offset + quality.REPLAY_SEED_OFFSET
    title, content = crl_envs.transferable_lesson(env.id, key, env.kwargs["max_episode_steps"])
    replay = LessonReplay({env.id: dict(env.kwargs)})
    try:  # levels of the key, on which the transferable lesson wins
        assert [replay.wins_following(env.id, seed, content) for seed in levels].count(True) >= 3
    finally:
        replay.close()
    answer = json.dumps([{"op": "add", "title": title, "content": content}])
    lesson = quality.added_lesson(f"<answer>{answer}</answer>", 0)
    assert lesson == f"{title}: {content}"
    assert quality.added_lesson('<answer>[{"op": "return"}]</answer>', 0) is None
    same = quality.replay_lessons(cfg, [(key, lesson)], 4)
    assert same["levels"] == 4 and same["extractor_wins"] == same["oracle_wins"] >= 3
    none = quality.replay_lessons(cfg, [(key, None)], 4)
    assert none["extractor_wins"] == 0 and none["oracle_wins"] == same["oracle_wins"]
    assert none["unread"] == 1
    wrong = quality.replay_lessons(cfg, [(key, f"{title}: from the start, play north.")], 4)
    assert wrong["extractor_wins"] < wrong["oracle_wins"]


def test_hardening_bank_replay_escapes_bank_text_and_bounds_its_lines(tmp_path, monkeypatch):
    """A lesson's moves are bank text: terminal escapes (a title change, a screen clear), NUL
    and a megabyte move used to reach the terminal as written."""
    import doctest

    from crl_harness.config import config_to_dict, load_config
    from crl_harness.experience.bank import ExperienceBank

    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(load_config("cpu-demo"))))
    script = EFFICACY.parent / "bank_replay.py"
    monkeypatch.syspath_prepend(str(script.parent))
    import bank_replay

    assert doctest.testmod(bank_replay).failed == 0
    cfg = load_config(str(tmp_path / "config.json"), [])
    _, keys, _ = bank_replay.replay_bank(cfg, [])
    hostile = "\x1b]0;owned\x07south\x1b[2J\x00, " + "x" * 1_000_000
    with ExperienceBank(tmp_path / "bank.sqlite") as bank:
        bank.add(cfg.tasks.envs[0].id, f"Winning moves from {keys[0]}",
                 f"from the start, play {hostile}.")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not any(c in done.stdout for c in "\x1b\x07\x00")
    assert "\\x1b]0;owned\\x07south\\x1b[2J\\x00, xxx" in done.stdout
    assert "more characters)" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) < 600


def _pairs_run(folder, revisit):
    folder.mkdir()
    step = {"pairs_revisit/guided_free": 2, "pairs_revisit/free_wins": 0,
            "pairs_revisit/guided_wins": revisit, "pairs_revisit/free_only": 0,
            "pairs_revisit/guided_only": revisit}
    (folder / "metrics.jsonl").write_text(json.dumps(step) + "\n")
    return folder


def test_guided_pairs_pools_the_runs_pairs(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("guided_pairs",
                                                  EFFICACY.parent / "guided_pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([str(_pairs_run(tmp_path / "a", 2)), str(_pairs_run(tmp_path / "b", 1))])
    out = capsys.readouterr().out
    assert "pooled | revisits: 4 pairs, guided 75.0%" in out
    assert "guided - free +75.0 points" in out


@pytest.mark.parametrize(("setup", "message"), [
    (lambda d: None, "no metrics.jsonl"),
    (lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text("{not json\n")), "not JSON lines"),
    (lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text("3\n")), "not JSON lines"),
    (lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text('{"step": 1, "pairs/guided_free": "x"}\n')),
     "not JSON lines"),
    (lambda d: (d.mkdir(), (d / "metrics.jsonl").write_text('{"pairs/guided_free": Infinity}\n')),
     "not JSON lines"),
])
def test_hardening_guided_pairs_wants_run_folders_with_metrics(tmp_path, setup, message):
    setup(tmp_path / "run")
    done = subprocess.run([sys.executable, str(EFFICACY.parent / "guided_pairs.py"),
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_key_coverage_prints_a_pool_with_several_levels_of_the_frequent_keys():
    """``--print-pool``: one level of each key that enough scanned levels hold, then second
    levels of the most frequent keys; every printed seed's key among the scanned ones."""
    import importlib.util
    from collections import Counter

    import gymnasium as gym

    env = gym.make("CRL/MiniHackRoom-v0", variant="dark")
    keys = {s: env.reset(seed=s)[1]["retrieval_query"] for s in range(60)}
    env.close()
    counts = Counter(keys.values())
    size = sum(n >= 2 for n in counts.values()) + 2  # every such key once, two keys twice
    done = subprocess.run([sys.executable, str(EFFICACY.parent / "key_coverage.py"),
                           "--print-pool", str(size), "--scan", "60", "--min-count", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("tasks.seeds=[")
    seeds = [int(s) for s in line[len("tasks.seeds=["):-1].split(",")]
    assert len(seeds) == len(set(seeds)) == size and max(seeds) < 60
    chosen = Counter(keys[s] for s in seeds)
    assert sorted(chosen.values()).count(2) == 2  # second levels of the two most frequent
    assert {k for k in counts if counts[k] >= 2} == set(chosen)
    # a key given a second level is at least as frequent as any key given one
    doubled = min(counts[k] for k, n in chosen.items() if n == 2)
    assert all(counts[k] <= doubled for k, n in chosen.items() if n == 1)
    spec = importlib.util.spec_from_file_location("key_coverage",
                                                  EFFICACY.parent / "key_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    levels = {0: "a", 1: "a", 2: "b", 3: "a", 4: "c"}
    assert module.pool_by_key(levels, 3, 1, 2) == [0, 2, 4]  # each key once before a second
    assert module.pool_by_key(levels, 4, 1, 2) == [0, 1, 2, 4]
    assert module.pool_by_key(levels, 4, 2, 3) == [0, 1, 3]  # b and c too rare: short


def test_key_coverage_counts_the_held_out_levels_whose_key_training_plays():
    """cpu-demo's first two steps play 6 pool levels (4 new, then 2 new and 2 revisits): the
    held-out levels that share a key with them are a subset of those the whole pool covers."""
    done = subprocess.run([sys.executable, str(EFFICACY.parent / "key_coverage.py"), "--levels",
                           "24", "--steps", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "plays 6 levels of 6 keys" in lines[1]
    schedule = int(lines[1].split(": ")[-1].split("/")[0])
    pool = int(lines[2].split(": ")[-1].split("/")[0])
    assert lines[2].startswith("the whole pool (32 levels of 32 keys)")
    assert 0 < schedule <= pool <= 24


def test_trainer_step_bench_distill_first_waits_for_the_steps_distillations(tmp_path,
                                                                             monkeypatch):
    """The ``-distill-first`` sides: the wrapped ``submit`` returns only once every request is
    distilled into the bank (the actor's update is then timed alone) and records the wait;
    unwrapped, ``submit`` returns while the extractor is still held back, the bank empty."""
    import json as json_module
    import re
    import threading

    monkeypatch.syspath_prepend(str(EFFICACY.parent))
    import trainer_step_bench

    from crl_harness.experience import DistillationRequest, ExperienceBank, ExperienceManager

    gate = threading.Event()  # the extractor answers only once the gate opens

    def held_extractor(prompt: str) -> str:
        assert gate.wait(timeout=30)
        task = re.search(r"## Task of the episode\n(.*)\n", prompt).group(1)
        op = {"op": "add", "title": f"stairs of {task}", "content": f"{task}: walk south."}
        return f"<answer>{json_module.dumps([op])}</answer>"

    class Owner:  # the trainer's ExperienceService, as far as a step's submit and flush go
        def __init__(self, manager):
            self.manager = manager

        def submit(self, requests):
            for request in requests:
                self.manager.submit(request)

        def flush(self, timeout=None):
            return self.manager.flush(timeout)

    requests = [DistillationRequest("CRL/MiniHackRoom-v0", f"level {i}", "obs: a room", True,
                                    1.0, [], step=1) for i in range(2)]
    for first in (False, True):
        gate.clear()
        with ExperienceBank(tmp_path / f"bank-{first}.sqlite") as bank, \
                ExperienceManager(bank, held_extractor) as manager:
            owner, waits = Owner(manager), []
            if first:
                owner.submit = trainer_step_bench._then_flush(owner, waits)
                opener = threading.Timer(0.5, gate.set)  # submit cannot return before this
                opener.start()
                owner.submit(requests)
                opener.join()
                assert len(bank) == 2 and len(waits) == 1 and waits[0] >= 0.5
            else:
                owner.submit(requests)
                assert len(bank) == 0 and waits == []
                gate.set()
            assert manager.flush(timeout=30) and len(bank) == 2
