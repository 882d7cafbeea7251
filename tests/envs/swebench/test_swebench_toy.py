"""CRL/SWEBenchToy-v0 end to end: real LocalSandbox checkouts, real pytest runs, swebench's report."""

from __future__ import annotations

import subprocess
import warnings

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.oracles import make_oracle, play_episode
from crl_envs.swebench.sandbox import UnisolatedSandboxWarning
from crl_envs.swebench.tools import format_tool_call

pytest.importorskip("swebench")

ENV_ID = "CRL/SWEBenchToy-v0"
# A plausible wrong fix: sorting by end fixes one of the two failing tests, not the other.
WRONG_OLD = "    for start, end in intervals:"
WRONG_NEW = "    for start, end in sorted(intervals, key=lambda interval: interval[1]):"


@pytest.fixture(autouse=True)
def _quiet_local_sandbox():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        yield


def make_env(**kwargs):
    return gym.make(ENV_ID, **kwargs)


def core_path(env) -> str:
    return env.unwrapped.sandbox.repo_dir + "/intervals/core.py"


def test_reset_shows_issue_and_repo_location():
    env = make_env()
    obs, info = env.reset(seed=0)
    repo = env.unwrapped.sandbox.repo_dir
    assert repo in obs and "<issue>" in obs and "merge()" in obs
    assert info["task"].startswith("`merge()` gives wrong results")
    assert "<function=" in info["instructions"]
    assert info["admissible_actions"] is None and info["won"] is False
    assert info["task_id"] == "crl-gym__toy-intervals-1"
    _, _, _, _, info = env.step("no tool call here")
    assert info["task_id"] == "crl-gym__toy-intervals-1" and not info["action_valid"]
    env.close()


def test_gold_patch_resolves_with_reward_one():
    env = make_env()
    episode = play_episode(env, make_oracle(ENV_ID, env), seed=0)
    info, steps = episode.info, episode.steps
    assert (episode.reward, episode.terminated, episode.truncated) == (1.0, True, False)
    assert info["resolved"] and info["won"] and info["submitted_by"] == "submit"
    assert info["fail_to_pass"] == 1.0 and info["pass_to_pass"] == 1.0
    assert "sorted(intervals)" in info["patch"]
    assert info["report"]["tests_status"]["FAIL_TO_PASS"]["failure"] == []
    assert steps == 2  # one str_replace, one submit
    env.close()


def test_wrong_fix_is_graded_unresolved():
    env = make_env()
    env.reset(seed=0)
    edit = format_tool_call("str_replace_editor", command="str_replace", path=core_path(env),
                            old_str=WRONG_OLD, new_str=WRONG_NEW)
    _, reward, _, _, info = env.step(edit)
    assert info["action_valid"] and reward == 0.0
    _, reward, terminated, _, info = env.step(format_tool_call("submit"))
    assert terminated and reward == 0.0 and not info["resolved"]
    assert info["fail_to_pass"] == 0.5 and info["pass_to_pass"] == 1.0
    env.close()


def test_empty_diff_is_graded_unresolved():
    env = make_env()
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(format_tool_call("submit"))
    assert terminated and reward == 0.0 and info["patch"] == ""
    assert info["fail_to_pass"] == 0.0 and not info["report"]["patch_exists"]
    env.close()


def test_step_limit_submits_current_diff():
    env = make_env(max_episode_steps=2, max_steps=2)
    env.reset(seed=0)
    gold = env.unwrapped.instance["patch"]
    assert "sorted(intervals)" in gold
    env.step(format_tool_call("str_replace_editor", command="str_replace", path=core_path(env),
                              old_str="    for start, end in intervals:",
                              new_str="    for start, end in sorted(intervals):"))
    obs, reward, terminated, truncated, info = env.step("not a tool call")
    assert truncated and reward == 1.0 and info["resolved"]
    assert info["submitted_by"] == "step_limit" and info["action_valid"] is False
    assert "Step limit (2) reached" in obs
    # Unresolved at the limit: truncated, not terminated, reward 0.
    env.reset(seed=0)
    env.step(format_tool_call("bash", command="true"))
    _, reward, terminated, truncated, info = env.step(format_tool_call("bash", command="true"))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["submitted_by"] == "step_limit" and info["patch"] == ""
    env.close()


def test_make_max_episode_steps_alone_moves_the_forced_submission():
    # gym.make's max_episode_steps reaches the env (its spec has none): the step that truncates
    # submits and grades, instead of a silent truncation with nothing graded.
    env = make_env(max_episode_steps=2)
    assert env.unwrapped._step_limit() == 2
    env.reset(seed=0)
    env.step(format_tool_call("bash", command="true"))
    _, reward, terminated, truncated, info = env.step(format_tool_call("bash", command="true"))
    assert truncated and info["submitted_by"] == "step_limit" and "resolved" in info
    env.close()
    assert make_env().unwrapped._step_limit() == 50


def test_malformed_call_is_invalid_and_changes_nothing():
    env = make_env()
    env.reset(seed=0)
    before = env.unwrapped.sandbox.read_file(core_path(env))
    for action in ["fix the bug please", "<function=rm_rf>\n</function>",
                   "<function=bash>\n<parameter=cmd>ls</parameter>\n</function>",
                   format_tool_call("bash", command="ls") * 2]:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["action_valid"] is False and not terminated and reward == 0.0
        assert obs.startswith("Invalid tool call:") and "<function=TOOL_NAME>" in obs
    assert env.unwrapped.sandbox.read_file(core_path(env)) == before
    env.close()


def test_reset_is_deterministic_and_task_id_option():
    env = make_env()
    obs_a, _ = env.reset(seed=3)
    obs_b, _ = env.reset(options={"task_id": "crl-gym__toy-intervals-1"})
    assert obs_a == obs_b  # the checkout is rebuilt at the same place
    with pytest.raises(KeyError, match="Unknown task_id"):
        env.reset(options={"task_id": "nope"})
    env.close()


def test_close_removes_checkout():
    env = make_env()
    env.reset(seed=0)
    repo = env.unwrapped.sandbox.repo_dir
    env.close()
    import os

    assert not os.path.exists(repo)


def _tree(root: str) -> dict[str, bytes]:
    import os

    files = {}
    for current, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            path = os.path.join(current, name)
            files[path] = b"->" + os.readlink(path).encode() if os.path.islink(path) else \
                open(path, "rb").read()
    return files


def test_random_editor_calls_never_raise_and_invalid_ones_change_nothing():
    import random

    env = make_env(max_steps=10_000, max_episode_steps=10_000)
    env.reset(seed=0)
    repo = env.unwrapped.sandbox.repo_dir
    rng = random.Random(0)
    paths = [repo, core_path(env), repo + "/intervals", repo + "/nope.py", "/", "/etc/passwd",
             repo + "/../x", "relative.py", "", repo + "/intervals/core.py/x", "/proc/self/fd/0"]
    values = ["", " ", "0", "-1", "5", "999", "[1, 2]", "[3,1]", "[1,-1]", "abc", "[1,2,3]",
              "merged = []", "\n", "\t", "é", "return"]
    commands = ["view", "create", "str_replace", "insert", "undo_edit", "bogus", ""]
    invalid = 0
    for _ in range(300):
        parameters = {"command": rng.choice(commands), "path": rng.choice(paths)}
        for key in ["file_text", "old_str", "new_str", "insert_line", "view_range"]:
            if rng.random() < 0.4:
                parameters[key] = rng.choice(values)
        before = _tree(repo)
        _, reward, terminated, _, info = env.step(format_tool_call("str_replace_editor",
                                                                   **parameters))
        assert not terminated and reward == 0.0
        if not info["action_valid"]:
            invalid += 1
            assert _tree(repo) == before, parameters
    assert 200 < invalid < 300  # most random calls are refused, some are real edits and views
    env.close()


def test_grading_log_is_whole_and_a_hanging_eval_times_out(tmp_path):
    from crl_envs.swebench.grading import grade_patch

    env = make_env()
    env.reset(seed=0)
    instance = dict(env.unwrapped.instance)
    # The eval script's own output is long (past the 16,000-character cut of tool output) and
    # comes before the tests: the grader must still see the test lines and the end marker.
    noisy = instance["eval_script"].replace(": '>>>>> Start Test Output'",
                                            "python -c \"print('y' * 40000)\"\n"
                                            ": '>>>>> Start Test Output'")
    grade = grade_patch(env.unwrapped.sandbox, {**instance, "eval_script": noisy},
                        instance["patch"], log_dir=tmp_path / "noisy")
    assert grade.resolved and (tmp_path / "noisy" / "test_output.txt").stat().st_size > 40000
    hanging = instance["eval_script"].replace(": '>>>>> Start Test Output'",
                                              "sleep 60\n: '>>>>> Start Test Output'")
    grade = grade_patch(env.unwrapped.sandbox, {**instance, "eval_script": hanging},
                        instance["patch"], timeout=1, log_dir=tmp_path / "hang")
    log = (tmp_path / "hang" / "test_output.txt").read_text()
    assert not grade.resolved and "Tests Timed Out" in log
    env.close()


def test_local_sandbox_on_a_rows_file_with_a_folder_of_clones(tmp_path):
    from crl_envs.swebench.data import TOY_DIR
    from crl_envs.swebench.env import SWEBenchEnv
    from crl_envs.swebench.sandbox import SandboxError, init_repo_from_files

    rows = str(TOY_DIR / "task.json")
    with pytest.raises(SandboxError, match="needs repos_dir="):
        SWEBenchEnv(dataset=rows, sandbox="local").reset(seed=0)
    clone = tmp_path / "repos" / "crl-gym__toy-intervals"
    init_repo_from_files(TOY_DIR / "repo", clone)
    # A later commit in the clone: the sandbox must check out the task's base commit.
    (clone / "intervals" / "core.py").write_text("BROKEN = True\n")
    subprocess.run(["git", "-c", "user.name=a", "-c", "user.email=a@a", "commit", "-qam", "later"],
                   cwd=clone, check=True)
    env = SWEBenchEnv(dataset=rows, sandbox="local", repos_dir=tmp_path / "repos")
    env.reset(seed=0)
    assert "BROKEN" not in env.sandbox.read_file(env.sandbox.repo_dir + "/intervals/core.py")
    episode = play_episode(env, make_oracle(ENV_ID, env), seed=0)
    assert episode.reward == 1.0 and episode.info["env_id"] == "CRL/SWEBench-v0"
    env.close()
