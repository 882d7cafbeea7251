"""DockerSandbox: what it sends to the docker SDK (a recording test double of the client), and a
real instance on a real daemon where one runs (skipped otherwise, with the reason)."""

from __future__ import annotations

import io
import os
import tarfile
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

import crl_envs  # noqa: F401
from crl_envs.swebench.data import load_instances
from crl_envs.swebench.grading import grade_patch
from crl_envs.swebench.sandbox import (
    CONTAINER_REPO,
    DockerSandbox,
    LocalSandbox,
    SandboxError,
    UnisolatedSandboxWarning,
    docker_client,
    ensure_image,
)
from crl_envs.swebench.sandbox.containers import _CONTAINER_INIT, _KILL_ALL_BUT_INIT
from crl_envs.swebench.tools import Tools, format_tool_call

pytest.importorskip("swebench")
pytest.importorskip("docker")


class FakeAPI:
    """Records exec calls; answers with queued (output, exit code) pairs, else ("", 0)."""

    def __init__(self):
        self.execs: list[dict] = []
        self.replies: list[tuple[bytes, int]] = []
        self._codes: dict[str, int] = {}

    def exec_create(self, container_id, cmd, **kwargs):
        exec_id = f"exec{len(self.execs)}"
        self.execs.append({"container": container_id, "cmd": cmd, **kwargs})
        output, code = self.replies.pop(0) if self.replies else (b"", 0)
        self._codes[exec_id] = code
        self._outputs = getattr(self, "_outputs", {})
        self._outputs[exec_id] = output
        return {"Id": exec_id}

    def exec_start(self, exec_id, stream=False, demux=False):
        # demux: (stdout, stderr) pairs; the shell's output is on stderr, its session on stdout
        return iter([(None, self._outputs[exec_id])])

    def exec_inspect(self, exec_id):
        return {"ExitCode": self._codes[exec_id]}


class FakeContainer:
    id = "c0ffee"

    def __init__(self):
        self.archives: dict[str, bytes] = {}
        self.removed = False

    def put_archive(self, path, data):
        self.archives[path] = data
        return True

    def get_archive(self, path):
        data = b"def f():\n    return 1\n"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(Path(path).name)
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        return iter([buffer.getvalue()]), {"name": Path(path).name}

    def remove(self, force=False):
        self.removed = force


class FakeClient:
    def __init__(self, local_images=(), pullable=True):
        self.api = FakeAPI()
        self.container = FakeContainer()
        self.runs: list[tuple[str, dict]] = []
        self.pulled: list[str] = []
        client = self

        class Images:
            def get(self, name):
                if name not in local_images:
                    raise LookupError(f"no such image: {name}")

            def pull(self, name):
                if not pullable:
                    raise LookupError(f"pull access denied for {name}")
                client.pulled.append(name)

        class Containers:
            def run(self, image, **kwargs):
                client.runs.append((image, kwargs))
                return client.container

        self.images, self.containers = Images(), Containers()


ROW = {"instance_id": "django__django-11099", "image": "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"}


def test_container_start_and_shell_commands():
    client = FakeClient(local_images=[ROW["image"]])
    box = DockerSandbox(ROW, client=client, run_id="t1")
    (image, kwargs), = client.runs
    assert image == ROW["image"] and kwargs["command"] == _CONTAINER_INIT
    assert kwargs["detach"] is True and kwargs["working_dir"] == CONTAINER_REPO == box.repo_dir
    assert kwargs["name"] == "crl.django__django-11099.t1" and client.pulled == []
    # the session starts from ~/.bashrc, where SWE-bench images activate the testbed conda env
    assert client.api.execs[0]["cmd"][-1] == "source ~/.bashrc >/dev/null 2>&1; true"
    client.api.replies.append((b"hello\n", 0))
    result = box.run("echo hello", timeout=7)
    sent = client.api.execs[-1]
    assert sent["container"] == "c0ffee" and sent["workdir"] == "/testbed" and sent["user"] == "root"
    assert sent["cmd"][:4] == ["timeout", "--kill-after=5", "7", "bash"]
    assert sent["cmd"][-3:] == ["bash", "", "echo hello"]  # no saved session yet
    assert result.output == "hello\n" and result.exit_code == 0 and not result.timed_out
    client.api.replies.append((b"partial", 124))
    assert box.run("sleep 99", timeout=1).timed_out
    assert box.diff() == "def f():\n    return 1\n"  # read back whole with get_archive
    assert "add -A" in client.api.execs[-2]["cmd"][-1]
    box.close()
    box.close()  # closing twice is harmless
    assert client.container.removed is True


def test_missing_image_is_pulled_or_explained():
    client = FakeClient()
    DockerSandbox(ROW, client=client).close()
    assert client.pulled == [ROW["image"]]
    with pytest.raises(SandboxError, match="prepare_images --instance_ids django__django-11099"):
        DockerSandbox(ROW, client=FakeClient(pullable=False))


def test_files_travel_as_tar_archives_and_the_editor_works_on_them():
    client = FakeClient(local_images=[ROW["image"]])
    box = DockerSandbox(ROW, client=client)
    tools = Tools(box)
    client.api.replies.append((b"file\n", 0))  # path_kind
    result = tools.call(format_tool_call("str_replace_editor", command="str_replace",
                                         path="/testbed/pkg/m.py", old_str="return 1",
                                         new_str="return 2"))
    assert result.valid, result.output
    with tarfile.open(fileobj=io.BytesIO(client.container.archives["/testbed/pkg"])) as tar:
        member = tar.getmember("m.py")
        assert tar.extractfile(member).read() == b"def f():\n    return 2\n"
    refused = tools.call(format_tool_call("str_replace_editor", command="view", path="pkg/m.py"))
    assert not refused.valid and "Maybe you meant /testbed/pkg/m.py" in refused.output


def test_grading_goes_through_swebench_run_instance(monkeypatch, tmp_path):
    """The patch goes to swebench's ``run_instance`` with the row's test spec; its log is graded
    by swebench's report. The log here is a real one: the toy task graded on the host."""
    from swebench.harness import run_evaluation
    from swebench.harness.constants import LOG_TEST_OUTPUT, RUN_EVALUATION_LOG_DIR

    (toy,) = load_instances("toy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        host = LocalSandbox(Path(crl_envs.__file__).parent / "swebench" / "toy" / "repo")
    real_log = host.evaluate(toy, toy["patch"], tmp_path / "host", timeout=120).read_text()
    host.close()

    calls = []

    def fake_run_instance(test_spec, pred, client, run_id, timeout=None, **kwargs):
        calls.append((test_spec, pred, client, run_id, timeout))
        log_dir = RUN_EVALUATION_LOG_DIR / run_id / pred["model_name_or_path"] / pred["instance_id"]
        log_dir.mkdir(parents=True)
        (log_dir / LOG_TEST_OUTPUT).write_text(real_log)

    monkeypatch.setattr(run_evaluation, "run_instance", fake_run_instance)
    monkeypatch.chdir(tmp_path)
    client = FakeClient(local_images=[toy["image"]])
    box = DockerSandbox(toy, client=client, run_id="grade")
    grade = grade_patch(box, toy, toy["patch"], timeout=900, log_dir=tmp_path / "logs")
    (spec, pred, sent_client, run_id, timeout), = calls
    assert spec.instance_id == toy["instance_id"] and spec.eval_script.startswith("#!/bin/bash")
    assert pred == {"instance_id": toy["instance_id"], "model_patch": toy["patch"],
                    "model_name_or_path": "crl"}
    assert sent_client.client is client and run_id.startswith("grade.") and timeout == 900
    assert grade.resolved and grade.fail_to_pass == 1.0 and grade.pass_to_pass == 1.0
    calls.clear()
    monkeypatch.setattr(run_evaluation, "run_instance", lambda *a, **k: None)  # did not apply
    assert not grade_patch(box, toy, "garbage patch", log_dir=tmp_path / "l2").resolved
    box.close()


@pytest.mark.data
def test_env_on_docker_sends_commands_to_the_instance_container(data_dir):
    folder = data_dir("swebench", "verified_test.parquet")
    (row,) = load_instances("verified", data_dir=folder, task_ids=["django__django-11099"])
    client = FakeClient(local_images=[row["image"]])
    env = gym.make("CRL/SWEBench-v0", data_dir=folder, task_ids=["django__django-11099"],
                   docker_client=client)
    obs, info = env.reset(seed=0)
    assert "/testbed" in obs and "UsernameValidator" in info["task"]
    client.api.replies.append((b"django\n", 0))
    obs, *_ = env.step(format_tool_call("bash", command="ls"))
    assert obs == "django\n[exit code 0]" and client.api.execs[-1]["cmd"][-1] == "ls"
    env.close()
    assert client.container.removed


def _daemon_or_skip():
    try:
        return docker_client()
    except SandboxError as err:
        pytest.skip(f"needs a Docker daemon: {err}")


def test_without_daemon_the_error_says_what_to_do():
    try:
        docker_client()
    except SandboxError as err:
        assert "Docker daemon" in str(err) and "sandbox='local'" in str(err)
    else:
        pytest.skip("a Docker daemon answers here; this test is for machines without one")


@pytest.mark.slow
@pytest.mark.docker
def test_real_instance_gold_patch_resolves_in_docker(data_dir):
    """On a machine with Docker: pulls the instance image (about 1-3 GB) and runs the
    official evaluation of the gold patch; skips, naming the image and how to get it, where
    it is neither here nor pullable (no network)."""
    client = _daemon_or_skip()
    folder = data_dir("swebench", "verified_test.parquet")
    (row,) = load_instances("verified", data_dir=folder, task_ids=["django__django-11099"])
    try:
        ensure_image(client, row["image"], row["instance_id"])
    except SandboxError as err:
        pytest.skip(str(err))
    env = gym.make("CRL/SWEBench-v0", data_dir=folder, task_ids=["django__django-11099"],
                   docker_client=client)
    from crl_envs.oracles import make_oracle, play_episode

    episode = play_episode(env, make_oracle("CRL/SWEBench-v0", env), seed=0)
    assert episode.reward == 1.0 and episode.info["resolved"]
    env.close()


class HostContainerClient(FakeClient):
    """A docker client double whose "container" is a host folder standing in for /testbed:
    exec really runs the argv (coreutils ``timeout``, bash, the shell wrapper, git), and the
    archives really are tar streams, so what DockerSandbox sends is executed, not just recorded."""

    def __init__(self, root: Path):
        super().__init__(local_images=[ROW["image"]])
        self.root = root
        client = self

        class API(FakeAPI):
            def exec_start(self, exec_id, stream=False, demux=False):
                import subprocess

                sent = self.execs[int(exec_id[4:])]
                if sent["cmd"][-3:] == _KILL_ALL_BUT_INIT:  # never on the host: it is no container
                    client.killed_all += 1
                    return iter([])
                argv = [client.host(arg) for arg in sent["cmd"]]
                done = subprocess.run(argv, cwd=client.host(sent["workdir"]),
                                      capture_output=True)
                # docker reports a signal death as 128 + N, as a shell does
                code = done.returncode
                self._codes[exec_id] = code if code >= 0 else 128 - code
                return iter([(done.stdout, done.stderr)])

        class Container(FakeContainer):
            def put_archive(self, path, data):
                with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                    tar.extractall(client.host(path), filter="data")
                return True

            def get_archive(self, path):
                buffer = io.BytesIO()
                with tarfile.open(fileobj=buffer, mode="w") as tar:
                    tar.add(client.host(path), arcname=Path(path).name)
                return iter([buffer.getvalue()]), {}

        self.api, self.container = API(), Container()
        self.killed_all = 0

    def host(self, arg: str) -> str:
        """Container paths (/testbed, /tmp, /tmp/.crl*) mapped into the host folder."""
        if arg == "/tmp":
            return f"{self.root}/tmp"
        return (arg.replace("/tmp/.crl", f"{self.root}/tmp/.crl")
                .replace(CONTAINER_REPO, f"{self.root}/testbed"))


def test_docker_commands_really_run(tmp_path):
    import subprocess

    testbed = tmp_path / "testbed"
    (testbed / "pkg").mkdir(parents=True)
    (testbed / "pkg" / "m.py").write_text("def f():\n    return 1\n")
    (tmp_path / "tmp").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=testbed, check=True)
    subprocess.run(["git", "add", "-A"], cwd=testbed, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b"],
                   cwd=testbed, check=True)
    client = HostContainerClient(tmp_path)
    box = DockerSandbox(ROW, client=client)
    tools = Tools(box, command_timeout=1)
    assert tools.call(format_tool_call("bash", command="cd pkg && X=5")).valid
    assert tools.call(format_tool_call("bash", command="echo $X; ls")).output == \
        "5\nm.py\n[exit code 0]"
    slow = tools.call(format_tool_call("bash", command="echo begun; sleep 30"))
    assert "timed out after 1 seconds" in slow.output
    killed = tools.call(format_tool_call("bash", command="kill -9 $$"))
    assert killed.output.endswith("[exit code 137]")  # died of SIGKILL, not a timeout
    edit = tools.call(format_tool_call("str_replace_editor", command="str_replace",
                                       path="/testbed/pkg/m.py", old_str="return 1",
                                       new_str="return 2"))
    assert edit.valid, edit.output
    created = tools.call(format_tool_call("str_replace_editor", command="create",
                                          path="/testbed/pkg/sub/new.py", file_text="N = 1\n"))
    assert created.valid and (testbed / "pkg" / "sub" / "new.py").read_text() == "N = 1\n"
    script = testbed / "run.sh"
    script.write_text("echo one\n")
    script.chmod(0o755)
    assert tools.call(format_tool_call("str_replace_editor", command="str_replace",
                                       path="/testbed/run.sh", old_str="one",
                                       new_str="two")).valid
    assert script.stat().st_mode & 0o777 == 0o755 and script.read_text() == "echo two\n"
    diff = box.diff()
    assert "+    return 2" in diff and "+++ b/pkg/sub/new.py" in diff
    box.close()


@pytest.mark.data
def test_seed_k_is_task_k_of_the_task_list(data_dir):
    folder = data_dir("swebench", "verified_test.parquet")
    wanted = ["django__django-11099", "astropy__astropy-12907", "sympy__sympy-20590"]
    client = FakeClient(local_images=[row["image"] for row in
                                      load_instances("verified", data_dir=folder, task_ids=wanted)])
    env = gym.make("CRL/SWEBench-v0", data_dir=folder, task_ids=wanted, docker_client=client)
    seen = [env.reset(seed=seed)[1]["task_id"] for seed in range(6)]
    assert seen == wanted + wanted
    env.close()


def _git_testbed(root: Path) -> Path:
    import subprocess

    testbed = root / "testbed"
    (testbed / "pkg").mkdir(parents=True)
    (testbed / "pkg" / "m.py").write_text("def f():\n    return 1\n")
    (root / "tmp").mkdir()
    subprocess.run(["git", "init", "-q"], cwd=testbed, check=True)
    subprocess.run(["git", "add", "-A"], cwd=testbed, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b"],
                   cwd=testbed, check=True)
    return testbed


def test_security_docker_timeout_kills_the_container_processes_and_session_is_kept(tmp_path):
    """Issue 19, defect 7 on the Docker sandbox (the commands really run, on a host folder):
    a timeout ends every process of the container, setsid ones included; the shell's session
    is not a file the agent can delete, nor a capture it can break by redefining builtins."""
    _git_testbed(tmp_path)
    client = HostContainerClient(tmp_path)
    box = DockerSandbox(ROW, client=client)
    tools = Tools(box, command_timeout=1)
    assert tools.call(format_tool_call("bash", command="cd pkg && export KEPT=1")).valid
    tools.call(format_tool_call("bash", command='rm -rf /tmp/.crl* "$__crl_state"; '
                                                "declare(){ :; }; builtin(){ :; }; AFTER=2"))
    out = tools.call(format_tool_call("bash", command="echo $KEPT $AFTER; basename $PWD")).output
    assert out == "1 2\npkg\n[exit code 0]"
    assert not list((tmp_path / "tmp").iterdir())  # the session went in as a file, read and gone
    assert client.killed_all == 0
    slow = tools.call(format_tool_call("bash", command="setsid sleep 30 >/dev/null 2>&1 & "
                                                       f"echo $! > {tmp_path}/s.pid; sleep 30"))
    assert "timed out" in slow.output and client.killed_all == 1
    os.kill(int((tmp_path / "s.pid").read_text()), 9)  # on this host double, the kill was ours
    box.close()


def test_security_docker_kill_acts_only_inside_our_container():
    import subprocess

    # Run here, on a host whose PID 1 is not our containers' init, the kill must do nothing.
    with open("/proc/1/cmdline", "rb") as handle:
        if handle.read().split(b"\0")[-2:-1] == [_CONTAINER_INIT[-1].encode()]:
            pytest.skip("this machine's PID 1 is our containers' init")
    done = subprocess.run(_KILL_ALL_BUT_INIT, capture_output=True)
    assert done.returncode == 1  # the guard failed; nothing was signalled


@pytest.mark.docker
def test_security_docker_setsid_process_dies_at_timeout_on_a_real_daemon():
    """On a machine with Docker and the toy image (`crl swe build-image toy`, offline): a
    setsid process started by a command that times out does not survive it, and the session
    survives hostile edits."""
    client = _daemon_or_skip()
    (row,) = load_instances("toy")
    try:
        ensure_image(client, row["image"], row["instance_id"])
    except SandboxError as err:
        pytest.skip(str(err))
    box = DockerSandbox(row, client=client)
    try:
        tools = Tools(box, command_timeout=2)
        started = tools.call(format_tool_call("bash", command="setsid sleep 300 & echo $!; "
                                                              "export KEPT=1; sleep 60"))
        assert "timed out" in started.output
        pid = started.output.split()[0]
        check = tools.call(format_tool_call("bash", command=f"kill -0 {pid} 2>/dev/null && "
                                                            "echo alive || echo dead"))
        assert check.output.startswith("dead")
        tools.call(format_tool_call("bash", command="export KEPT=1; rm -rf /tmp/.crl*; "
                                                    "declare(){ :; }"))
        assert tools.call(format_tool_call("bash", command="echo $KEPT")).output == \
            "1\n[exit code 0]"
    finally:
        box.close()


def test_hardening_docker_background_job_holding_the_output_does_not_hold_the_command():
    """A background job (a server, say) keeps the exec's output stream open after the shell
    exits: the command still returns once its session has come back."""
    import threading

    never = threading.Event()

    class HeldAPI(FakeAPI):
        def exec_start(self, exec_id, stream=False, demux=False):
            def chunks():
                yield None, b"started\n"
                yield b"export KEPT=1\n# crl-state-end\n", None
                never.wait()  # the background job never closes the stream
            return chunks()

    client = FakeClient(local_images=[ROW["image"]])
    client.api = HeldAPI()
    box = DockerSandbox(ROW, client=client)
    result = box.run("python -m http.server &", timeout=30)
    assert not result.timed_out and result.output == "started\n"  # held: timed out at 30 s
    assert box._shell_state.startswith(b"export KEPT=1")
    never.set()
    box.close()


def test_hardening_docker_write_failures_are_invalid_actions_not_crashes():
    class Refusing(FakeContainer):
        def put_archive(self, path, data):
            raise RuntimeError("500 Server Error: not a directory")

    client = FakeClient(local_images=[ROW["image"]])
    client.container = Refusing()
    box = DockerSandbox(ROW, client=client)
    tools = Tools(box)
    client.api.replies.append((b"", 0))  # path_kind: nothing there
    result = tools.call(format_tool_call("str_replace_editor", command="create",
                                         path="/testbed/x/new.py", file_text="x = 1\n"))
    assert not result.valid and "could not write" in result.output
    box._shell_state = b"export A=1\n# crl-state-end\n"  # /tmp refuses the session file too
    assert tools.call(format_tool_call("bash", command="true")).valid
    box.close()
