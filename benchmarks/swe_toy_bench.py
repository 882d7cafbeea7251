"""CRL/SWEBenchToy-v0 on the local and the Docker sandbox, side by side; 8 concurrent Docker
episodes and a check that none of their containers is left.

An episode is what the gold-patch oracle plays: reset (a fresh checkout: a git clone on the
host, a new container from the toy image in Docker), one ``str_replace_editor`` edit,
``submit`` (diff, the patch applied to a pristine copy, the toy's eval script with pytest,
swebench's report; in Docker through swebench's ``run_instance`` in a fresh container).
Figures are medians of ``--runs`` runs: the episode and its phases, the sandbox's start
(``LocalSandbox`` / ``DockerSandbox`` built and closed), and single tool calls (one command's
round trip). Then ``--concurrent`` Docker episodes run at once, each in its own env and thread;
it fails (exit 1) if one is not resolved or a container with our label is left.

The Docker column needs a daemon and the toy image (``crl swe build-image toy``, README,
"SWE-bench with Docker"); without them it is left out, with the reason.

    .venv/bin/python benchmarks/swe_toy_bench.py [--runs 5] [--concurrent 8] [--sandbox both]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.oracles import make_oracle
from crl_envs.swebench.data import TOY_DIR, load_instances
from crl_envs.swebench.sandbox import (
    SANDBOX_LABEL,
    DockerSandbox,
    LocalSandbox,
    SandboxError,
    UnisolatedSandboxWarning,
    docker_client,
    ensure_image,
)
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
        "bash true": format_tool_call("bash", command="true"),
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


def sandbox_start_seconds(kind: str, client: Any) -> float:
    """Seconds to start a sandbox of the toy task and close it."""
    started = time.perf_counter()
    if kind == "docker":
        DockerSandbox(load_instances("toy")[0], client=client).close()
    else:
        LocalSandbox(TOY_DIR / "repo").close()
    return time.perf_counter() - started


def measure(kind: str, runs: int, client: Any) -> dict[str, float]:
    """Medians of ``runs`` episodes, sandbox starts and tool calls on one sandbox kind."""
    env = gym.make(ENV_ID, sandbox=kind, docker_client=client)
    episode_phases(env, seed=0)  # warm-up: imports, the datasets cache, the page cache
    episodes = [episode_phases(env, seed) for seed in range(runs)]
    tools = []
    for seed in range(runs):
        env.reset(seed=seed)
        tools.append(tool_call_seconds(env))
    env.close()
    starts = [sandbox_start_seconds(kind, client) for _ in range(runs)]
    figures = {name: statistics.median(run[name] for run in episodes) for name in episodes[0]}
    figures["sandbox start + close"] = statistics.median(starts)
    figures.update({name: statistics.median(run[name] for run in tools) for name in tools[0]})
    return figures


def concurrent_episodes(count: int, client: Any) -> tuple[float, int, list[str]]:
    """``count`` Docker oracle episodes at once: seconds, how many resolved, and the names of
    containers with our label left afterwards (must be none)."""
    def one(seed: int) -> bool:
        env = gym.make(ENV_ID, sandbox="docker", docker_client=client)
        try:
            return episode_phases(env, seed)["episode"] > 0
        finally:
            env.close()

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=count) as pool:
        resolved = sum(pool.map(one, range(count)))
    seconds = time.perf_counter() - started
    left = [container.name for container in client.containers.list(
        all=True, filters={"label": SANDBOX_LABEL})]
    return seconds, resolved, left


def docker_or_reason() -> tuple[Any, str]:
    """A client of a daemon with the toy image, or ``None`` and why not."""
    try:
        client = docker_client()
        row = load_instances("toy")[0]
        ensure_image(client, row["image"], row["instance_id"])
    except SandboxError as err:
        return None, str(err)
    return client, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (default 5)")
    parser.add_argument("--concurrent", type=int, default=8,
                        help="Docker episodes at once (default 8; 0: skip)")
    parser.add_argument("--sandbox", choices=["both", "local", "docker"], default="both")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UnisolatedSandboxWarning)
    kinds = ["local", "docker"] if args.sandbox == "both" else [args.sandbox]
    client, reason = docker_or_reason() if "docker" in kinds else (None, "")
    if client is None and "docker" in kinds:
        print(f"Docker column left out: {reason}", file=sys.stderr)
        kinds.remove("docker")
    columns = {kind: measure(kind, args.runs, client) for kind in kinds}

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{ENV_ID}, median of {args.runs} runs ({os.cpu_count()} CPUs, load average {load} "
          "at the end)")
    print(f"{'seconds':<24}" + "".join(f"{kind:>10}" for kind in kinds))
    for name in columns[kinds[0]]:
        scale, unit = (1000, " ms") if name.startswith(("bash", "editor")) else (1, "")
        print(f"{name + unit:<24}" + "".join(f"{scale * columns[kind][name]:>10.3f}"
                                              for kind in kinds))
    if client is None or args.concurrent <= 0:
        return 0
    seconds, resolved, left = concurrent_episodes(args.concurrent, client)
    print(f"\n{args.concurrent} concurrent Docker episodes: {seconds:.1f} s, {resolved} resolved, "
          f"containers with label {SANDBOX_LABEL} left: {len(left)} {left or ''}")
    return 0 if resolved == args.concurrent and not left else 1


if __name__ == "__main__":
    sys.exit(main())
