"""The SWE sandbox against an adversarial agent (issue 19, part A): reward hacks through test
files and test configuration, processes that escape or outlive their kill, git run under the
agent's configuration, quadratic parsing and editing, byte corruption, symlink races, episodes
that do not end, unbounded patches. Every test is selected by ``pytest -k "hardening or security"``.
"""

from __future__ import annotations

import os
import resource
import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.error import ResetNeeded

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.swebench.sandbox import LocalSandbox, UnisolatedSandboxWarning
from crl_envs.swebench.sandbox import files as files_module
from crl_envs.swebench.sandbox import supervised as supervised_module
from crl_envs.swebench.tools import (
    MAX_ACTION_CHARS,
    MAX_EDITOR_FILE_BYTES,
    ToolCallError,
    Tools,
    format_tool_call,
    parse_tool_call,
)

pytest.importorskip("swebench")

ENV_ID = "CRL/SWEBenchToy-v0"

# A pytest hook that reports every test as passed: the reward hack of defect 1.
PASS_EVERYTHING = """\
import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


@pytest.fixture(autouse=True)
def _quiet_local_sandbox():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        yield


@pytest.fixture
def box(tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("a = 1\nb = 2\n")
    sandbox = LocalSandbox(source)
    yield sandbox
    sandbox.close()


def edit(tools, **parameters):
    return tools.call(format_tool_call("str_replace_editor", **parameters))


def bash(tools, command):
    return tools.call(format_tool_call("bash", command=command))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _wait_dead(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    return not _alive(pid)


def _play(env, *actions):
    """Reset the toy task, create the files given as (path relative to the repo, text), submit."""
    env.reset(seed=0)
    repo = env.unwrapped.sandbox.repo_dir
    for relative, text in actions:
        _, _, _, _, info = env.step(format_tool_call("str_replace_editor", command="create",
                                                     path=f"{repo}/{relative}", file_text=text))
        assert info["action_valid"], relative
    return env.step(format_tool_call("submit"))


# ----------------------------------------------------------------------------- 1: reward hack
HACKS = {
    "conftest": [("conftest.py", PASS_EVERYTHING)],
    "nested-conftest": [("tests/conftest.py", PASS_EVERYTHING)],
    "pytest.ini": [("pass_everything.py", PASS_EVERYTHING),
                   ("pytest.ini", "[pytest]\naddopts = -p pass_everything\n")],
    "setup.cfg": [("pass_everything.py", PASS_EVERYTHING),
                  ("setup.cfg", "[tool:pytest]\naddopts = -p pass_everything\n")],
    "tox.ini": [("pass_everything.py", PASS_EVERYTHING),
                ("tox.ini", "[pytest]\naddopts = -p pass_everything\n")],
    "sitecustomize": [("sitecustomize.py", "import os\n")],
}


@pytest.mark.parametrize("hack", sorted(HACKS))
def test_security_test_files_and_test_config_cannot_resolve_the_task(hack):
    env = gym.make(ENV_ID)
    _, reward, terminated, _, info = _play(env, *HACKS[hack])
    assert terminated and reward == 0.0 and not info["resolved"]
    dropped = {path for path, _ in HACKS[hack] if path != "pass_everything.py"}
    assert dropped <= set(info["dropped_paths"]) and "not graded" in info["grading_note"]
    env.close()


def test_security_swebench_grading_keeps_upstream_behaviour_and_gold_still_resolves():
    env = gym.make(ENV_ID, grading="swebench")
    _, reward, _, _, info = _play(env, *HACKS["conftest"])
    assert reward == 1.0 and info["dropped_paths"] == []  # upstream's harness is hackable
    env.close()
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    repo = env.unwrapped.sandbox.repo_dir
    env.step(format_tool_call("str_replace_editor", command="str_replace",
                              path=f"{repo}/intervals/core.py",
                              old_str="    for start, end in intervals:",
                              new_str="    for start, end in sorted(intervals):"))
    env.step(format_tool_call("str_replace_editor", command="create", path=f"{repo}/conftest.py",
                              file_text=PASS_EVERYTHING))
    _, reward, _, _, info = env.step(format_tool_call("submit"))
    assert reward == 1.0 and info["dropped_paths"] == ["conftest.py"]
    assert "conftest.py" not in info["patch"] and "sorted(intervals)" in info["patch"]
    env.close()


def test_security_patch_filter_cannot_be_fooled_by_headers_inside_a_section():
    from crl_envs.swebench.grading import filter_patch

    smuggled = ("diff --git a/src.py b/src.py\n--- a/src.py\n+++ b/src.py\n@@ -1 +1 @@\n-x\n+y\n"
                "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1 @@\n+import evil\n")
    kept, dropped = filter_patch(smuggled)
    assert "conftest" not in kept and "+y" in kept and dropped == ["conftest.py"]
    quoted = ('diff --git "a/t\\303\\251/conftest.py" "b/t\\303\\251/conftest.py"\nnew file mode '
              '100644\n--- /dev/null\n+++ "b/t\\303\\251/conftest.py"\n@@ -0,0 +1 @@\n+x\n')
    assert filter_patch(quoted) == ("", ["té/conftest.py"])


# ----------------------------------------------------------------------------- 2: recycled ids
def test_hardening_close_signals_only_processes_it_still_owns(box, monkeypatch):
    box.run("true", timeout=10)
    box.run("sleep 60 &", timeout=10)  # a live background job: close() must end it
    stale = []

    def recording_kill(kill):
        def kill_if_alive(pid, sig):
            if not _alive(abs(pid)):
                stale.append(pid)  # an id whose process is gone may belong to anyone now
                return None
            return kill(pid, sig)
        return kill_if_alive

    monkeypatch.setattr(supervised_module.os, "killpg", recording_kill(os.killpg))
    monkeypatch.setattr(supervised_module.os, "kill", recording_kill(os.kill))
    box.close()
    assert stale == []


# ----------------------------------------------------------------------------- 3: git at submit
def test_security_agent_git_config_does_not_run_on_submit(box, tmp_path):
    marker = tmp_path / "ran-on-host"
    tools = Tools(box, command_timeout=10)
    hostile = (f"git config core.fsmonitor 'touch {marker}; sleep 5; false' && "
               f"git config diff.external 'sh -c \"touch {marker}\"' && "
               f"printf '#!/bin/sh\\ntouch {marker}\\n' > .git/hooks/pre-commit && "
               f"chmod +x .git/hooks/pre-commit && echo '* diff=evil' > .gitattributes && "
               f"git config diff.evil.textconv 'sh -c \"touch {marker}\"'")
    assert bash(tools, hostile).output.endswith("[exit code 0]")
    marker.unlink(missing_ok=True)
    assert edit(tools, command="str_replace", path=box.repo_dir + "/pkg/mod.py",
                old_str="b = 2", new_str="b = 3").valid
    patch = box.diff()
    assert not marker.exists()  # the fsmonitor hook (touch, then sleep 5) never ran
    assert "+b = 3" in patch


# ----------------------------------------------------------------------------- 4: quadratic tools
def test_hardening_long_or_pathological_actions_are_refused_quickly(box):
    """How quickly (linear time): ``benchmarks/hardening_speed.py``."""
    tools = Tools(box)
    nested = "<function=bash>" * (190_000 // len("<function=bash>"))
    with pytest.raises(ToolCallError):
        parse_tool_call(nested)
    with pytest.raises(ToolCallError):
        parse_tool_call("<function=" * 19_000)  # tags without their ">"
    unclosed = "<function=bash><parameter=command>" + "<parameter=x>" * 14_000
    with pytest.raises(ToolCallError, match="not closed"):
        parse_tool_call(unclosed)
    result = tools.call("<function=bash>" * (MAX_ACTION_CHARS // 10))
    assert not result.valid and f"{MAX_ACTION_CHARS:,}" in result.output


def test_hardening_editor_refuses_files_too_large_to_load(box):
    tools = Tools(box)
    big = Path(box.repo_dir) / "big.txt"
    with open(big, "wb") as handle:
        handle.write(b"x = 1\n" * (20_000_000 // 6))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for parameters in [dict(command="str_replace", old_str="x = 2", new_str="y"),
                       dict(command="view"), dict(command="insert", insert_line="1", new_str="y")]:
        result = edit(tools, path=str(big), **parameters)
        assert not result.valid and f"{MAX_EDITOR_FILE_BYTES:,}" in result.output
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB


# ----------------------------------------------------------------------------- 5: bytes kept
def test_hardening_edit_of_a_non_utf8_file_keeps_its_other_bytes(box):
    tools = Tools(box)
    path = Path(box.repo_dir) / "latin1.py"
    path.write_bytes(b"name = 'caf\xe9'\r\nx = 2\r\n\xff\xfe tail\n")
    assert edit(tools, command="str_replace", path=str(path), old_str="x = 2",
                new_str="x = 3").valid
    assert path.read_bytes() == b"name = 'caf\xe9'\r\nx = 3\r\n\xff\xfe tail\n"
    assert edit(tools, command="undo_edit", path=str(path)).valid
    assert path.read_bytes() == b"name = 'caf\xe9'\r\nx = 2\r\n\xff\xfe tail\n"


# ----------------------------------------------------------------------------- 6: symlink race
def test_security_symlink_swapped_in_after_the_check_is_not_followed(box, tmp_path, monkeypatch):
    tools = Tools(box)
    secret = tmp_path / "secret.txt"
    secret.write_text("b = 2 SECRET\n")
    target = Path(box.repo_dir) / "pkg" / "mod.py"
    real_realpath = os.path.realpath

    def realpath_then_swap(path, *args, **kwargs):
        # The agent wins every race: a file when the path is checked, a link right after.
        if str(path).endswith("mod.py"):
            target.unlink()
            target.write_text("a = 1\nb = 2\n")
        resolved = real_realpath(path, *args, **kwargs)
        if str(path).endswith("mod.py"):
            target.unlink()
            target.symlink_to(secret)
        return resolved

    monkeypatch.setattr(files_module.os.path, "realpath", realpath_then_swap)
    for parameters in [dict(command="view"),
                       dict(command="str_replace", old_str="b = 2", new_str="b = PWNED")]:
        result = edit(tools, path=str(target), **parameters)
        assert "SECRET" not in result.output and not result.valid, parameters
    assert secret.read_text() == "b = 2 SECRET\n"


# ----------------------------------------------------------------------------- 7: shell escapes
def test_security_setsid_and_orphaned_processes_die_at_the_timeout(box, tmp_path):
    tools = Tools(box, command_timeout=1)
    result = bash(tools, f"setsid sleep 60 & echo $! > {tmp_path}/a.pid; "
                         f"(setsid sleep 61 & echo $! > {tmp_path}/b.pid); sleep 60")
    assert "timed out" in result.output
    for name in ["a.pid", "b.pid"]:
        assert _wait_dead(int((tmp_path / name).read_text())), name


def test_security_close_kills_setsid_background_jobs(tmp_path):
    (tmp_path / "src").mkdir()
    sandbox = LocalSandbox(tmp_path / "src")
    sandbox.run(f"(setsid sleep 62 & echo $! > {tmp_path}/c.pid)", timeout=10)
    pid = int((tmp_path / "c.pid").read_text())
    assert _alive(pid)
    sandbox.close()
    assert _wait_dead(pid)


def test_hardening_background_job_outlives_the_command_that_started_it(box, tmp_path):
    tools = Tools(box, command_timeout=5)
    done = tmp_path / "done"
    result = bash(tools, f"(sleep 0.3; echo late; echo later >&2; sleep 0.2; touch {done}) & "
                         "echo started")
    assert result.output == "started\n[exit code 0]"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not done.exists():
        time.sleep(0.05)
    assert done.exists(), "the background job died (SIGPIPE) when the command's output closed"


def test_security_shell_state_cannot_be_deleted_or_broken_by_the_agent(box):
    tools = Tools(box, command_timeout=5)
    bash(tools, 'rm -rf -- "$__crl_state"; cd pkg; export KEPT=1')
    assert bash(tools, "echo $KEPT; basename $PWD").output == "1\npkg\n[exit code 0]"
    bash(tools, "declare(){ :; }; alias(){ :; }; builtin(){ :; }; compgen(){ :; }; AFTER=2")
    assert bash(tools, "echo $KEPT $AFTER; basename $PWD").output == "1 2\npkg\n[exit code 0]"
    bash(tools, "declare(){ echo 'sleep 999'; }; LAST=3")
    assert bash(tools, "echo $LAST").output == "3\n[exit code 0]"


# ----------------------------------------------------------------------------- 8: episode end
def test_hardening_step_after_the_step_limit_refuses(tmp_path):
    env = gym.make(ENV_ID, max_episode_steps=1, max_steps=1)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(format_tool_call("bash", command="true"))
    assert truncated and not terminated and info["submitted_by"] == "step_limit"
    marker = tmp_path / "ran-after-end"
    with pytest.raises(ResetNeeded):
        env.step(format_tool_call("bash", command=f"touch {marker}"))
    assert not marker.exists()
    env.reset(seed=0)  # a new episode starts normally
    _, _, terminated, _, _ = env.step(format_tool_call("submit"))
    with pytest.raises(ResetNeeded):
        env.step(format_tool_call("submit"))
    env.close()


# ----------------------------------------------------------------------------- 9: patch size
def test_hardening_oversized_patch_is_not_applied_or_graded():
    from crl_envs.swebench.grading import MAX_PATCH_BYTES

    env = gym.make(ENV_ID)
    env.reset(seed=0)
    repo = env.unwrapped.sandbox.repo_dir
    lines = MAX_PATCH_BYTES // 20 + 1000
    env.step(format_tool_call("bash", command=f"cd {repo} && python -c \"import sys; "
                              f"sys.stdout.write(''.join(f'value_{{i:012d}} = 1\\\\n' "
                              f"for i in range({lines})))\" > intervals/data.py"))
    _, reward, terminated, _, info = env.step(format_tool_call("submit"))
    assert terminated and reward == 0.0 and not info["resolved"]
    assert not info["report"]["patch_successfully_applied"] and "too large" in info["grading_note"]
    assert len(info["patch"]) <= MAX_PATCH_BYTES
    env.close()


def test_hardening_submission_keeps_upstream_diff_semantics(box, tmp_path):
    """The diff now comes from a private index: files the agent's .gitignore names stay
    tracked (as with the checkout's own index), and a checkout swapped for a link submits
    nothing rather than the link's target."""
    tools = Tools(box)
    bash(tools, "echo 'pkg/' > .gitignore && echo c = 3 >> pkg/mod.py")
    patch = box.diff()
    assert "+c = 3" in patch and "deleted file" not in patch and "+pkg/" in patch
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    checkout = Path(box.repo_dir)
    checkout.rename(tmp_path / "moved")
    checkout.symlink_to(outside)
    assert box.diff() == ""


def test_hardening_edit_history_is_bounded(box, monkeypatch):
    from crl_envs.swebench import tools as tools_module

    monkeypatch.setattr(tools_module, "MAX_HISTORY_CHARS", 100)
    tools = Tools(box)
    path = box.repo_dir + "/pkg/big.py"
    assert edit(tools, command="create", path=path, file_text="x" * 60 + "\n").valid
    for index in range(4):
        assert edit(tools, command="insert", path=path, insert_line="0", new_str=f"# {index}").valid
    assert tools._kept_chars <= 100
    assert edit(tools, command="undo_edit", path=path).valid  # the latest versions are kept
    assert Path(path).read_text().startswith("# 2\n")


@pytest.mark.data
def test_hardening_filter_keeps_every_verified_gold_patch_whole(data_dir):
    """The hardened grading must not cost a correct fix: every reference patch of SWE-bench
    Verified passes the filter byte for byte (one changes setup.cfg: files the reference fix
    changes are part of the task)."""
    from crl_envs.swebench.data import load_instances
    from crl_envs.swebench.grading import _patch_paths, filter_patch

    rows = load_instances("verified", data_dir=data_dir("swebench", "verified_test.parquet"))
    changed = [row["instance_id"] for row in rows
               if filter_patch(row["patch"], protected=_patch_paths(row["test_patch"]),
                               allowed=_patch_paths(row["patch"])) != (row["patch"], [])]
    assert len(rows) == 500 and changed == []
