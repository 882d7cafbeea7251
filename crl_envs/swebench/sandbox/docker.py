"""``DockerSandbox``: a container of the instance's SWE-bench image, repository at ``/testbed``.

Holds ``DockerSandbox``, driven through the docker SDK and graded by swebench's own
``run_instance``, and how it reads an exec's streams (``_stream_until_done``) and tells a
command that could not start (``_could_not_start``).
"""

from __future__ import annotations

import io
import os
import queue
import shlex
import shutil
import tarfile
import threading
import time
import uuid
import weakref
from pathlib import Path, PurePosixPath
from typing import Any

from crl_envs.swebench.sandbox.base import (
    _READ_CAP,
    CONTAINER_REPO,
    MAX_PATCH_BYTES,
    CommandResult,
    FileTooLargeError,
    PathOutsideSandboxError,
    Sandbox,
    SandboxError,
    cut_output,
)
from crl_envs.swebench.sandbox.containers import (
    _CONTAINER_INIT,
    _KILL_ALL_BUT_INIT,
    ContainerLimits,
    _HardenedClient,
    _remove_container,
    _swept_stale,
    docker_client,
    ensure_image,
    remove_stale_containers,
    sandbox_labels,
)
from crl_envs.swebench.sandbox.git import _DIFF_ARGS, _GIT_GUARDS, _GIT_TIMEOUT
from crl_envs.swebench.sandbox.shell import _SHELL_WRAPPER, _STATE_END, _STATE_LIMIT

__all__ = ["DockerSandbox"]


def _stream_until_done(stream: Any, deadline: float,
                       session: bytearray | None) -> Any:
    """The (stdout, stderr) chunks of an exec stream until it ends, the deadline passes, or,
    for a shell command, shortly after its session has come back: a background job that keeps
    the exec's output open must not hold the command (the stream is then read, and dropped, by
    a daemon thread until the job ends or the container goes)."""
    chunks: queue.Queue = queue.Queue()
    abandoned = threading.Event()

    def pump() -> None:
        try:
            for chunk in stream:
                if not abandoned.is_set():  # after that, read only to keep the writers going
                    chunks.put(chunk)
        except Exception:  # the container went away: the stream just ends
            pass
        finally:
            chunks.put(None)

    threading.Thread(target=pump, daemon=True, name="crl-docker-stream").start()
    done_at = None
    try:
        while True:
            now = time.monotonic()
            wait = deadline - now if done_at is None else \
                min(deadline - now, done_at + 0.05 - now)
            if wait <= 0:
                return
            try:
                chunk = chunks.get(timeout=wait)
            except queue.Empty:
                return
            if chunk is None:
                return
            yield chunk
            if done_at is None and session is not None and \
                    session.rstrip(b"\n").endswith(_STATE_END.encode()):
                done_at = time.monotonic()
    finally:
        abandoned.set()


# Before the shell wrapper in the container: the saved session comes from a file that is read
# and deleted before the command runs; fd 3, where the wrapper writes the session, is the exec's
# stdout stream, and the command's output goes to its stderr stream.
_DOCKER_PRELUDE = r"""
if [ -n "$1" ]; then exec < "$1"; rm -f -- "$1"; else exec < /dev/null; fi
exec 3>&1 1>&2
shift
"""


# The exit codes of an exec the daemon cannot start ("cannot be invoked", "not found"), and
# what the agent is told then.
_EXEC_FAILED_CODES = (126, 127)
# What bash and coreutils print when the container's process limit is reached.
_NO_PROCESS_SLOT = ("fork system call failed", "fork: Resource temporarily unavailable",
                    "fork: retry: Resource temporarily unavailable")
_RESTARTED = ("[The container was restarted{rerun}: every process in it had to be ended (the "
              "files and the shell's variables are kept; background jobs are gone).]\n")
_UNUSABLE = ("The container cannot start any command, even after a restart: its shell or "
             "basic programs are gone (after `rm -rf /`, say). What is left of the repository "
             "is still graded: call submit to end the episode.\nDocker said: {error}")


def _could_not_start(result: CommandResult, session: bytes) -> bool:
    """Whether a shell command failed for want of a process slot (bash or coreutils
    ``timeout`` unable to fork) or of the container's own programs: then the daemon's exec
    fails (126, 127) and no saved session comes back, as the shell never ran (the daemon may
    write its error where the session goes)."""
    if result.exit_code in _EXEC_FAILED_CODES and \
            not session.rstrip(b"\n").endswith(_STATE_END.encode()):
        return True
    return result.exit_code != 0 and any(sign in result.output for sign in _NO_PROCESS_SLOT)


class DockerSandbox(Sandbox):
    """A container of the instance's SWE-bench image, with the repository at ``/testbed``.

    The image is the row's ``image`` field (swebench 5.x; pulled if absent). Commands run
    through ``exec`` as ``timeout --kill-after=5 T bash -c WRAPPER``; when that timeout fires,
    every process of the container but its init is killed, ``setsid`` ones included (the
    container is the command's session; background jobs of earlier commands end too); when
    that kill cannot run (a fork bomb holds every process slot), the container is restarted,
    which ends all its processes and keeps its files. The
    shell's session is kept in this process: it goes in as a file deleted before the command
    runs and comes back on the exec's stdout stream. Files move as tar archives
    (``put_archive``, ``get_archive``). Grading hands the patch to swebench's official
    ``run_instance``, which starts a fresh container from the same image.

    Hardened by default (``limits``, a ``ContainerLimits``): no network, memory and process
    limits, for the agent's container and the grading one alike. Both carry labels naming
    this process; the first sandbox of a process removes the containers that processes killed
    before they could close theirs left behind (``remove_stale_containers``).
    Images in the ``crl-gym/`` namespace are local builds (``crl swe build-image``), never
    pulled.
    """

    def __init__(self, instance: dict[str, Any], client: Any = None,
                 run_id: str | None = None, limits: ContainerLimits | None = None) -> None:
        self.client = client if client is not None else docker_client()
        self.image = instance["image"]
        self.instance_id = instance["instance_id"]
        self.base_commit = instance.get("base_commit", "HEAD")
        self.run_id = run_id or f"crl-{uuid.uuid4().hex[:8]}"
        self.repo_dir = CONTAINER_REPO
        self.limits = limits or ContainerLimits()
        self._shell_state = b""
        if not _swept_stale.is_set():
            _swept_stale.set()
            remove_stale_containers(self.client)
        ensure_image(self.client, self.image, self.instance_id)
        self.container = self.client.containers.run(
            self.image, command=_CONTAINER_INIT, detach=True, user="root",
            working_dir=CONTAINER_REPO,
            name=f"crl.{self.instance_id.lower()}.{self.run_id}",
            labels=sandbox_labels(), **self.limits.run_kwargs(),
        )
        # Runs on close(), or when the sandbox is collected or the interpreter exits unclosed.
        self._finalizer = weakref.finalize(self, _remove_container, self.container)
        # What an interactive shell would read: SWE-bench images activate the `testbed` conda
        # env in /root/.bashrc, and SWE-agent's interactive session starts from it.
        self.run("source ~/.bashrc >/dev/null 2>&1; true", timeout=120)

    def _exec(self, argv: list[str], timeout: float,
              session: bytearray | None = None) -> CommandResult:
        """Run ``argv`` in the container. With ``session``, the exec's stdout stream is the
        shell's saved session (it goes there) and its stderr stream the output."""
        api = self.client.api
        seconds = max(1, int(timeout))
        wrapped = ["timeout", "--kill-after=5", str(seconds), *argv]
        started = time.monotonic()
        try:
            exec_id = api.exec_create(self.container.id, wrapped, workdir=CONTAINER_REPO,
                                      user="root", environment={"PAGER": "cat", "GIT_PAGER": "cat",
                                                                "TERM": "dumb"})["Id"]
            stream = api.exec_start(exec_id, stream=True, demux=True)
        except Exception as err:  # docker.errors.APIError: the container stopped, say
            return CommandResult(f"The container could not run the command: {err}",
                                 _EXEC_FAILED_CODES[0])
        kept, total = bytearray(), 0
        for out, err in _stream_until_done(stream, deadline=started + seconds + 10,
                                           session=session):
            if session is not None and out:
                if len(session) <= _STATE_LIMIT:
                    session += out
                out = None
            for chunk in (out, err):
                if chunk:
                    total += len(chunk)
                    if len(kept) < _READ_CAP:
                        kept += chunk[: _READ_CAP - len(kept)]
        state = api.exec_inspect(exec_id)
        for _ in range(100):  # the daemon may report the exec as running a moment after EOF
            if not state.get("Running"):
                break
            time.sleep(0.02)
            state = api.exec_inspect(exec_id)
        exit_code = state["ExitCode"]
        output = cut_output(kept.decode("utf-8", errors="replace"),
                            total=total if total > len(kept) else None)
        # coreutils timeout exits 124 when it sent TERM, 137 when it needed KILL; a command
        # that died of SIGKILL on its own also gives 137, but sooner.
        if exit_code == 124 or (exit_code == 137 and time.monotonic() - started >= seconds):
            return CommandResult(output, None, timed_out=True)
        return CommandResult(output, exit_code)

    def run(self, command: str, timeout: float) -> CommandResult:
        session = bytearray()
        result = self._run_in_session(command, timeout, session)
        if _could_not_start(result, session):
            # Every process slot is taken (a fork bomb left running in the background), or
            # the container's own programs are gone (`rm -rf /`), or it stopped.
            self._restart()
            session = bytearray()
            result = self._run_in_session(command, timeout, session)
            if _could_not_start(result, session):
                error = result.output.strip() or session.decode(errors="replace").strip()
                return CommandResult(_UNUSABLE.format(error=error), result.exit_code)
            result.output = _RESTARTED.format(rerun="; the command was run again") + result.output
        if result.timed_out:
            # `timeout` kills its process group; setsid and daemonized processes left it.
            self._exec(_KILL_ALL_BUT_INIT, timeout=30)
            if self._exec(["true"], timeout=30).exit_code != 0:  # the kill could not run
                self._restart()
                result.output = _RESTARTED.format(rerun="") + result.output
        elif session.rstrip(b"\n").endswith(_STATE_END.encode()) and len(session) <= _STATE_LIMIT:
            self._shell_state = bytes(session)
        return result

    def _run_in_session(self, command: str, timeout: float, session: bytearray) -> CommandResult:
        """One command in the saved session; the session it leaves goes to ``session``."""
        state_file = ""
        if self._shell_state:
            state_file = f"/tmp/.crl-session-{uuid.uuid4().hex}"
            try:
                self._put_file(PurePosixPath(state_file), self._shell_state, mode=0o600)
            except SandboxError:  # the agent broke /tmp: a fresh session lets it repair that
                state_file = ""
        return self._exec(["bash", "-c", _DOCKER_PRELUDE + _SHELL_WRAPPER, "bash", state_file,
                           command], timeout, session=session)

    def _restart(self) -> None:
        """End every process of the container, its init too, and start it again: its files
        (the repository, the agent's edits) stay."""
        try:
            self.container.restart(timeout=0)
        except Exception:  # docker.errors.APIError: it cannot start again (`rm -rf /`); the
            pass           # command that follows says so

    def check_path(self, path: str) -> str:
        if not path.startswith("/"):
            raise PathOutsideSandboxError(f"The path {path!r} is not absolute.")
        return str(PurePosixPath(path))

    def diff(self) -> str:
        # A fresh name the agent cannot have prepared (as a link, say); git with the guards
        # against configuration the agent wrote; the patch cut just past the size grading takes.
        patch_file = f"/tmp/.crl-diff-{uuid.uuid4().hex}"
        git = "git " + " ".join(shlex.quote(arg) for arg in _GIT_GUARDS)
        diff = " ".join(shlex.quote(arg) for arg in _DIFF_ARGS)
        command = (f"{git} add -A && {git} {diff} {shlex.quote(self.base_commit)} "
                   f"| head -c {MAX_PATCH_BYTES + 1} > {patch_file}")
        result = self._exec(["bash", "-c", command], timeout=_GIT_TIMEOUT)
        try:
            return self.read_file(patch_file) if result.exit_code == 0 else ""
        finally:
            self._exec(["rm", "-f", "--", patch_file], timeout=30)

    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        # get_archive, not `cat` through exec: file contents must not be cut like output.
        try:
            stream, info = self.container.get_archive(self.check_path(path))
        except Exception as err:  # docker.errors.NotFound and friends
            raise FileNotFoundError(f"{path}: {err}") from err
        size = (info or {}).get("size", 0)
        if max_bytes is not None and size > max_bytes:  # known before the transfer
            raise FileTooLargeError(path, size, max_bytes)
        try:
            archive = b"".join(stream)
        except Exception as err:  # the stream broke off (the daemon, the container)
            raise FileNotFoundError(f"{path}: {err}") from err
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None and member.isfile() else None
            if handle is None:
                raise FileNotFoundError(f"{path} is not a regular file")
            if max_bytes is not None and member.size > max_bytes:
                raise FileTooLargeError(path, member.size, max_bytes)
            return handle.read().decode("utf-8", errors="surrogateescape")

    def write_file(self, path: str, text: str) -> None:
        target = PurePosixPath(self.check_path(path))
        data = text.encode("utf-8", errors="surrogateescape")
        # mkdir, and the mode of the file being replaced (an edited script stays executable)
        mode = self._exec(["bash", "-c", 'mkdir -p -- "$(dirname -- "$1")" && '
                           '{ stat -c %a -- "$1" 2>/dev/null || echo 644; }', "bash", str(target)],
                          timeout=30).output.strip()
        self._put_file(target, data, int(mode, 8) if mode.isdigit() else 0o644)

    def _put_file(self, target: PurePosixPath, data: bytes, mode: int) -> None:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(name=target.name)
            member.size = len(data)
            member.mtime = int(time.time())
            member.mode = mode
            tar.addfile(member, io.BytesIO(data))
        try:
            self.container.put_archive(str(target.parent), buffer.getvalue())
        except Exception as err:  # docker.errors.APIError and friends: the agent's tree is odd
            raise SandboxError(f"could not write {target} in the container: {err}") from err

    def remove_file(self, path: str) -> None:
        self._exec(["rm", "-f", "--", self.check_path(path)], timeout=30)

    def path_kind(self, path: str) -> str | None:
        path = self.check_path(path)
        result = self._exec(["bash", "-c", 'if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; '
                             'then echo file; fi', "bash", path], timeout=30)
        return result.output.strip() or None

    def list_dir(self, path: str, depth: int = 2) -> list[str]:
        path = self.check_path(path)
        result = self._exec(["find", path, "-mindepth", "1", "-maxdepth", str(depth),
                             "-not", "-path", "*/.*"], timeout=60)
        return sorted(line for line in result.output.splitlines() if line)

    def evaluate(self, instance: dict[str, Any], patch: str, log_dir: Path,
                 timeout: float) -> Path | None:
        from swebench.harness.constants import LOG_TEST_OUTPUT, RUN_EVALUATION_LOG_DIR
        from swebench.harness.run_evaluation import run_instance
        from swebench.harness.utils import make_test_spec

        prediction = {"instance_id": self.instance_id, "model_patch": patch,
                      "model_name_or_path": "crl"}
        # A run id per grading: run_instance returns a cached report when its run dir has one.
        run_id = f"{self.run_id}.{uuid.uuid4().hex[:8]}"
        run_instance(make_test_spec(instance), prediction,
                     _HardenedClient(self.client, self.limits), run_id, timeout=int(timeout))
        run_dir = RUN_EVALUATION_LOG_DIR / run_id
        log = run_dir / "crl" / self.instance_id / LOG_TEST_OUTPUT
        try:
            if not log.exists():  # run_instance logs and swallows a patch that does not apply
                return None
            log_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, log_dir / LOG_TEST_OUTPUT)
            return log_dir / LOG_TEST_OUTPUT
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
            try:  # and swebench's log folders, when empty: a grading leaves nothing behind
                os.removedirs(RUN_EVALUATION_LOG_DIR)
            except OSError:  # another grading's logs are there, or the user's
                pass

    def close(self) -> None:
        finalizer = getattr(self, "_finalizer", None)  # absent when the container never started
        if finalizer is not None:
            finalizer()
