"""DockerSandbox on a real Docker daemon with the toy image built offline (issue 14).

Every test here is marked ``docker``: it runs where a daemon answers and the toy image is
there (``crl swe build-image toy``, as root; README "SWE-bench with Docker"), and skips with
the reason otherwise. The bad inputs (fork bomb, ``rm -rf /``, an endless loop, 1 GB of
output, a binary blob, programs waiting on stdin, a memory bomb, the network) are
``hardening`` tests: each ends as an observation, the episode goes on, the host is untouched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401  (registers the ids)
from crl_envs.oracles import make_oracle
from crl_envs.swebench.images import BASE_IMAGE, TOY_IMAGE, build_toy_image
from crl_envs.swebench.sandbox import (
    OUTPUT_LIMIT,
    SANDBOX_LABEL,
    ContainerLimits,
    SandboxError,
    UnisolatedSandboxWarning,
    docker_client,
    remove_stale_containers,
)
from crl_envs.swebench.tools import format_tool_call

pytest.importorskip("swebench")
pytest.importorskip("docker")
pytestmark = pytest.mark.docker

ENV_ID = "CRL/SWEBenchToy-v0"


def _image_there(client, name: str) -> bool:
    try:
        client.images.get(name)
    except Exception:  # docker.errors.ImageNotFound
        return False
    return True


@pytest.fixture(scope="module")
def client():
    """A client of a daemon that has the toy image (finished from the base image if only that
    is there: seconds, offline), or a skip that says what is missing."""
    try:
        client = docker_client()
    except SandboxError as err:
        pytest.skip(f"needs a Docker daemon: {err}")
    if not _image_there(client, TOY_IMAGE):
        if not _image_there(client, BASE_IMAGE):
            pytest.skip(f"needs the toy image {TOY_IMAGE}, built offline: run "
                        "`crl swe build-image toy` as root (README, SWE-bench with Docker)")
        build_toy_image(client)
    yield client
    assert not ours(client), f"containers left behind: {ours(client)}"


def ours(client) -> list[str]:
    """The sandbox containers of this process (other runs may share the daemon)."""
    return [container.name for container in client.containers.list(
        all=True, filters={"label": SANDBOX_LABEL})
        if container.labels.get("crl-gym.owner", "").split(":")[1:2] == [str(os.getpid())]]


# One core at most: the busy loops below must not take the whole machine from other work.
ONE_CORE = ContainerLimits(cpus=1.0)


@pytest.fixture
def env(client):
    env = gym.make(ENV_ID, sandbox="docker", docker_client=client, command_timeout=5,
                   eval_timeout=120, container_limits=ONE_CORE)
    yield env
    env.close()


def bash(env, command: str) -> tuple[str, dict]:
    obs, _, _, _, info = env.step(format_tool_call("bash", command=command))
    return obs, info


def play_oracle(env, seed: int = 0) -> tuple[float, dict]:
    obs, info = env.reset(seed=seed)
    agent = make_oracle(ENV_ID, env)
    agent.reset(obs, info)
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(agent.act(obs, info))
        done = terminated or truncated
    return reward, info


@pytest.fixture
def host_sentinel(tmp_path):
    """A file on the host and the listing of the working directory: the bad input must leave
    both as they were."""
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("untouched\n")
    before = sorted(os.listdir("."))
    yield
    assert sentinel.read_text() == "untouched\n"
    assert sorted(os.listdir(".")) == before
    assert subprocess.run(["true"]).returncode == 0  # the host can still start processes


def goes_on(env) -> None:
    """The episode goes on: a command runs, the repository is there."""
    obs, info = bash(env, "echo still here; ls /testbed")
    assert info["action_valid"] and "still here" in obs and "intervals" in obs, obs


# ----------------------------------------------------------------------------- the toy, for real
def test_docker_toy_oracle_resolves(env):
    reward, info = play_oracle(env)
    assert reward == 1.0 and info["resolved"] and info["fail_to_pass"] == 1.0
    assert info["report"]["patch_successfully_applied"]


def test_docker_toy_same_episode_as_local(env):
    """The same task prompt (the repository at /testbed), the same files, the same tools."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        local = gym.make(ENV_ID, sandbox="local")
        local_obs, local_info = local.reset(seed=0)
        local_dir = local.unwrapped.sandbox.repo_dir
        local_ls, _ = bash(local, "git ls-files && git log --format=%H")
        local.close()
    obs, info = env.reset(seed=0)
    assert obs == local_obs.replace(local_dir, "/testbed") and "/testbed" in obs
    assert info["task_id"] == local_info["task_id"]
    ls, _ = bash(env, "git ls-files && git log --format=%H")
    assert ls == local_ls
    view = env.step(format_tool_call("str_replace_editor", command="view",
                                     path="/testbed/intervals/core.py"))[0]
    assert "def merge(intervals):" in view
    obs, reward, terminated, _, info = env.step(format_tool_call("submit"))
    assert terminated and reward == 0.0 and info["patch"] == ""


def test_docker_toy_wrong_fix_is_graded_unresolved(env):
    env.reset(seed=0)
    env.step(format_tool_call("str_replace_editor", command="str_replace",
                              path="/testbed/intervals/core.py", old_str="merged = []",
                              new_str="merged = []  # no fix"))
    _, reward, terminated, _, info = env.step(format_tool_call("submit"))
    assert terminated and reward == 0.0 and info["report"]["patch_successfully_applied"]
    assert info["fail_to_pass"] == 0.0 and info["pass_to_pass"] == 1.0


def test_docker_concurrent_episodes_leave_no_container(client):
    """Episodes in threads, each with its own env: all resolved, all their containers gone."""
    from concurrent.futures import ThreadPoolExecutor

    def one(seed: int) -> float:
        env = gym.make(ENV_ID, sandbox="docker", docker_client=client)
        try:
            return play_oracle(env, seed)[0]
        finally:
            env.close()

    with ThreadPoolExecutor(max_workers=3) as pool:
        assert list(pool.map(one, range(3))) == [1.0, 1.0, 1.0]
    assert not ours(client)


def test_security_docker_container_is_hardened(env, client):
    env.reset(seed=0)
    box = env.unwrapped.sandbox
    config = client.api.inspect_container(box.container.id)
    host = config["HostConfig"]
    assert host["NetworkMode"] == "none" and host["Memory"] == 4 * 2**30
    assert host["MemorySwap"] == host["Memory"] and host["PidsLimit"] == 1024
    assert not host["Binds"] and not config["Mounts"] and not host["Privileged"]
    assert config["Config"]["Labels"][SANDBOX_LABEL] == "1"
    obs, _ = bash(env, "ls /sys/class/net; python3 -c \"import socket; "
                       "socket.create_connection(('1.1.1.1', 53), timeout=3)\"")
    assert obs.splitlines()[0] == "lo" and "OSError" in obs and "[exit code 1]" in obs
    goes_on(env)


# ----------------------------------------------------------------------------- bad inputs
def test_hardening_docker_fork_bomb(client, host_sentinel):
    # A lower process limit and half a core: the bomb fills it sooner and spins on less CPU.
    env = gym.make(ENV_ID, sandbox="docker", docker_client=client, command_timeout=5,
                   container_limits=ContainerLimits(pids=256, cpus=0.5))
    try:
        fork_bomb_then_next_episode(env)
    finally:
        env.close()


def fork_bomb_then_next_episode(env) -> None:
    env.reset(seed=0)
    started = time.monotonic()
    obs, info = bash(env, ":(){ :|:& };:")
    assert info["action_valid"] and time.monotonic() - started < 60
    # The bomb goes on in the background until the process limit stops it; the next command
    # finds no free slot, and the container is restarted (its files kept) to run it.
    obs, info = bash(env, "echo after the bomb")
    assert "after the bomb" in obs, obs
    goes_on(env)
    reward, info = play_oracle(env, seed=1)  # the next episode is not affected
    assert reward == 1.0


def test_hardening_docker_rm_rf_root(client, host_sentinel):
    # Time enough for rm to finish on a loaded machine: a half-deleted tree may still run `ls`.
    env = gym.make(ENV_ID, sandbox="docker", docker_client=client, command_timeout=120,
                   container_limits=ONE_CORE)
    try:
        rm_rf_root_then_next_episode(env)
    finally:
        env.close()


def rm_rf_root_then_next_episode(env) -> None:
    env.reset(seed=0)
    obs, _ = bash(env, "rm -rf /")
    assert "dangerous to operate recursively on '/'" in obs  # GNU rm refuses by default
    obs, _ = bash(env, "rm -rf --no-preserve-root / 2>/dev/null; echo gone")
    assert "gone" in obs, obs
    obs, info = bash(env, "ls /testbed")
    assert "cannot start any command" in obs and "call submit" in obs, obs
    _, reward, terminated, _, info = env.step(format_tool_call("submit"))
    assert terminated and reward == 0.0
    reward, info = play_oracle(env, seed=1)  # a fresh container: the next episode is whole
    assert reward == 1.0


def test_hardening_docker_endless_loop(env, host_sentinel):
    env.reset(seed=0)
    started = time.monotonic()
    obs, info = bash(env, "while :; do :; done")
    assert "timed out after 5 seconds" in obs and time.monotonic() - started < 30
    goes_on(env)


def test_hardening_docker_one_gigabyte_of_output(env, host_sentinel):
    env.reset(seed=0)
    started = time.monotonic()
    obs, info = bash(env, "head -c 1000000000 /dev/zero | tr '\\0' x; echo; echo end")
    assert info["action_valid"] and time.monotonic() - started < 60
    assert len(obs) < OUTPUT_LIMIT + 200 and "<output cut" in obs, obs[-300:]
    goes_on(env)


def test_hardening_docker_binary_blob_in_a_file(env, host_sentinel):
    env.reset(seed=0)
    obs, info = bash(env, "head -c 3000000 /dev/urandom > /testbed/blob.bin; cat blob.bin")
    assert info["action_valid"] and len(obs) < OUTPUT_LIMIT + 200
    view = env.step(format_tool_call("str_replace_editor", command="view",
                                     path="/testbed/blob.bin"))[0]
    assert "blob.bin" in view
    goes_on(env)
    _, reward, terminated, _, info = env.step(format_tool_call("submit"))
    assert terminated and reward == 0.0 and "blob.bin" in info["patch"]


def test_hardening_docker_commands_waiting_on_stdin(env, host_sentinel):
    env.reset(seed=0)
    obs, info = bash(env, "cat; read line; python3; echo read=$?")
    assert "read=0" in obs and "timed out" not in obs, obs  # an open stdin: the 5 s timeout
    goes_on(env)


def test_hardening_docker_memory_bomb(client, host_sentinel):
    """A small limit here, to spare the machine: the default is 4 GB."""
    env = gym.make(ENV_ID, sandbox="docker", docker_client=client, command_timeout=30,
                   container_limits=ContainerLimits(memory="256m", cpus=1.0))
    try:
        env.reset(seed=0)
        obs, info = bash(env, "python3 -c 'b = bytearray(2**30)'")
        assert "Killed" in obs and obs.endswith("[exit code 137]"), obs
        goes_on(env)
    finally:
        env.close()


# ----------------------------------------------------------------------------- leftovers
_HOLDER = """
import sys, time
from crl_envs.swebench.data import load_instances
from crl_envs.swebench.sandbox import DockerSandbox
box = DockerSandbox(load_instances("toy")[0])
print(box.container.name, flush=True)
time.sleep(600)
"""


def test_hardening_docker_killed_process_leaves_containers_the_next_start_removes(client):
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(crl_envs.__file__).parents[1])})
    name = holder.stdout.readline().strip()
    assert name.startswith("crl.crl-gym__toy-intervals-1.")
    assert remove_stale_containers(client) == []  # its owner still runs: kept
    holder.kill()  # kill -9: no close(), no finalizer
    holder.wait()
    assert client.containers.get(name)  # left behind
    assert remove_stale_containers(client) == [name]
    assert not client.containers.list(all=True, filters={"name": name})


# ----------------------------------------------------------------------------- the real benchmark
@pytest.mark.data
def test_real_instance_image_missing_skips_with_the_way_to_get_it(client, data_dir):
    """Where the instance image is neither local nor pullable (no network), DockerSandbox says
    which image is missing and how to get it; the real-instance test skips with that."""
    from crl_envs.swebench.data import load_instances
    from crl_envs.swebench.sandbox import ensure_image

    folder = data_dir("swebench", "verified_test.parquet")
    (row,) = load_instances("verified", data_dir=folder, task_ids=["django__django-11099"])
    try:
        ensure_image(client, row["image"], row["instance_id"])
    except SandboxError as err:
        assert row["image"] in str(err) and "prepare_images" in str(err)
    else:
        pytest.skip(f"{row['image']} is here: the real-instance test runs instead")
    with pytest.raises(SandboxError, match="build-image toy"):
        ensure_image(client, "crl-gym/not-built:latest", "x")
