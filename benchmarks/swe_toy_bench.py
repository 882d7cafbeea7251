"""Seconds per CRL/SWEBenchToy-v0 episode (goal: 2 s or less) and per tool call.

An episode is what the gold-patch oracle plays: reset (a fresh git checkout), one
``str_replace_editor`` edit, ``submit`` (diff, a fresh clone at the base commit, the patch
applied, the toy's eval script with pytest, swebench's report). Tool calls are timed on one
checkout: ``bash`` (``ls``, and a command that changes the session's state), editor ``view``,
``str_replace`` then ``undo_edit``. Every figure is the median of ``--runs`` runs.

    .venv/bin/python benchmarks/swe_toy_bench.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.oracles import make_oracle
from crl_envs.swebench.sandbox import UnisolatedSandboxWarning
from crl_envs.swebench.tools import format_tool_call

ENV_ID = "CRL/SWEBenchToy-v0"


def episode_phases(env: gym.Env, seed: int) -> dict[str, float]:
    """Seconds of one oracle episode, split into reset, edits and the graded submit."""
    start = time.perf_counter()
    obs, info = env.reset(seed=seed)
    phases = {"reset": time.perf_counter() - start, "edit steps": 0.0, "submit (grading)": 0.0}
    agent = make_oracle(ENV_ID, env)
    agent.reset(obs, info)
    done = False
    while not done:
        action = agent.act(obs, info)
        started = time.perf_counter()
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        phases["submit (grading)" if done else "edit steps"] += time.perf_counter() - started
    assert reward == 1.0, "the gold patch must resolve the toy task"
    phases["episode"] = time.perf_counter() - start
    return phases


def tool_call_seconds(env: gym.Env) -> dict[str, float]:
    """Seconds of single tool calls on the current checkout."""
    core = env.unwrapped.sandbox.repo_dir + "/intervals/core.py"
    calls = {
        "bash ls": format_tool_call("bash", command="ls"),
        "bash cd+export": format_tool_call("bash", command="cd intervals && export X=1"),
        "editor view": format_tool_call("str_replace_editor", command="view", path=core),
        "editor str_replace": format_tool_call(
            "str_replace_editor", command="str_replace", path=core,
            old_str="    merged = []", new_str="    merged: list = []"),
        "editor undo_edit": format_tool_call("str_replace_editor", command="undo_edit", path=core),
    }
    timings = {}
    for name, action in calls.items():
        started = time.perf_counter()
        _, _, _, _, info = env.step(action)
        timings[name] = time.perf_counter() - started
        assert info["action_valid"], name
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs per figure (default 7)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UnisolatedSandboxWarning)
    env = gym.make(ENV_ID)
    episode_phases(env, seed=0)  # warm-up: imports, the datasets cache, the page cache
    episodes = [episode_phases(env, seed) for seed in range(args.runs)]
    tools = []
    for seed in range(args.runs):
        env.reset(seed=seed)
        tools.append(tool_call_seconds(env))
    env.close()

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{ENV_ID}, median of {args.runs} runs ({os.cpu_count()} CPUs, load average {load})")
    print(f"{'phase':<22}{'seconds':>10}")
    for name in episodes[0]:
        print(f"{name:<22}{statistics.median(run[name] for run in episodes):>10.3f}")
    median_episode = statistics.median(run["episode"] for run in episodes)
    print(f"goal: episode <= 2 s -> {'met' if median_episode <= 2.0 else 'NOT met'}")
    print(f"\n{'tool call':<22}{'ms':>10}")
    for name in tools[0]:
        print(f"{name:<22}{1000 * statistics.median(run[name] for run in tools):>10.1f}")


if __name__ == "__main__":
    main()
