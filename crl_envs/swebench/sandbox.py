"""Where an SWE task's repository lives and its commands run: one interface, two sandboxes.

Holds:
- ``CommandResult``: what one shell command produced (bounded output, exit code, timeout flag).
- ``Sandbox``: the interface the tools and the env use (shell, files, diff, grading run).
- ``LocalSandbox``: a temporary git checkout on this host. Opt-in: commands run unisolated.
- ``DockerSandbox``: a container of the instance's SWE-bench image, repository at ``/testbed``,
  driven through the docker SDK; graded by swebench's own ``run_instance``.
- ``PathOutsideSandboxError``, ``SandboxError``, ``UnisolatedSandboxWarning``.

The shell is persistent in the sense of SWE-agent: the working directory, shell and exported
variables, functions and aliases carry over from one command to the next. Each command runs as
a fresh ``bash`` in its own process group that first restores that state and saves it on exit,
so a timeout can kill the whole group without losing the session.
"""

from __future__ import annotations

import io
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import warnings
import weakref
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from crl_envs.errors import UserFacingError

__all__ = [
    "CommandResult",
    "Sandbox",
    "LocalSandbox",
    "DockerSandbox",
    "SandboxError",
    "PathOutsideSandboxError",
    "UnisolatedSandboxWarning",
    "OUTPUT_LIMIT",
    "cut_output",
]

# SWE-agent's observation cap: longer tool output is cut, with a marker saying so.
OUTPUT_LIMIT = 16_000
# Bytes kept from a command's output stream before the rest is only counted (memory bound).
_READ_CAP = 4 * OUTPUT_LIMIT

# The eval scripts of SWE-bench put the repository here; observations name it.
CONTAINER_REPO = "/testbed"

# Restores the session (cwd, shell and exported variables, functions, aliases), runs the
# command with stdin closed (an interactive program must not wait for input that never comes),
# and saves the session on every exit path, `exit N` included; the exit status stays the
# command's. Bash's own dynamic and read-only variables are not saved. An EXIT trap the command
# sets is dropped, as a persistent shell would run it only when the session ends.
_SHELL_WRAPPER = r"""
__crl_state=$1; __crl_cmd=$2; set --
shopt -s expand_aliases
if [ -f "$__crl_state/env" ]; then
  unset $(compgen -e) 2>/dev/null  # the saved session's environment, not the inherited one
  . "$__crl_state/env" 2>/dev/null
fi
if [ -f "$__crl_state/cwd" ]; then cd "$(< "$__crl_state/cwd")" 2>/dev/null; fi
__crl_save() {
  {
    for __crl_v in $(compgen -v); do
      case $__crl_v in
        __crl_*|BASH|BASH[_O]*|BASHPID|COMP_*|DIRSTACK|EPOCH*|EUID|FUNCNAME|GROUPS|HISTCMD|\
        LINENO|OPTIND|PIPESTATUS|PPID|PWD|RANDOM|SECONDS|SHELLOPTS|SHLVL|SRANDOM|UID|_) ;;
        *) declare -p "$__crl_v" ;;
      esac
    done
    declare -f; alias -p
  } > "$__crl_state/env.tmp" 2>/dev/null \
    && command -p mv -f "$__crl_state/env.tmp" "$__crl_state/env"
  pwd > "$__crl_state/cwd"
}
trap __crl_save EXIT
eval "$__crl_cmd" < /dev/null
__crl_rc=$?
__crl_save
trap - EXIT
exit $__crl_rc
"""

# Against the base commit, not HEAD: changes the agent has committed are part of its answer.
_DIFF_COMMAND = "git add -A && git -c core.fileMode=false diff --cached --no-color {base}"

# swebench's patch-application fallbacks (harness.run_evaluation.GIT_APPLY_CMDS), in order, less
# `git apply --reject`, which leaves a half-applied tree behind.
_APPLY_COMMANDS = (
    ["git", "apply", "--verbose"],
    ["git", "apply", "--verbose", "--3way"],
    ["patch", "--batch", "--forward", "--fuzz=5", "-p1", "-i"],
)


# The variables of this process a LocalSandbox's commands inherit (plus its own and `env=`).
_PASSED_ENV = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
                         "TMPDIR"})


class SandboxError(UserFacingError, RuntimeError):
    """The sandbox cannot be set up or used; the message says what to do."""


class PathOutsideSandboxError(ValueError):
    """A file path resolves (through ``..`` or symlinks) outside the sandbox's checkout."""


class UnisolatedSandboxWarning(UserWarning):
    """``LocalSandbox`` runs the agent's commands on this host, with the user's permissions."""


@dataclass
class CommandResult:
    """The result of one shell command: output cut to ``OUTPUT_LIMIT`` characters."""

    output: str
    exit_code: int | None
    timed_out: bool = False


def cut_output(text: str, limit: int = OUTPUT_LIMIT, total: int | None = None) -> str:
    """Cut ``text`` to ``limit`` characters and say so; ``total`` is the real length if known.

    >>> cut_output("abcdef", limit=3)
    'abc\\n<output cut: showing the first 3 of 6 characters>'
    """
    total = max(total or 0, len(text))
    if total <= limit:
        return text
    return text[:limit] + f"\n<output cut: showing the first {limit:,} of {total:,} characters>"


class Sandbox(ABC):
    """A repository checkout with a persistent shell, file access, a diff and a grading run.

    ``repo_dir`` is the repository's location as the agent sees it. Paths given to the file
    methods are absolute paths in that view; ``check_path`` refuses the ones the sandbox must
    not touch.
    """

    repo_dir: str

    @abstractmethod
    def run(self, command: str, timeout: float) -> CommandResult:
        """Run ``command`` in the persistent shell; kill it after ``timeout`` seconds."""

    @abstractmethod
    def check_path(self, path: str) -> str:
        """Return the absolute path the file methods will touch, or raise ``PathOutsideSandboxError``."""

    @abstractmethod
    def read_file(self, path: str) -> str:
        """The text of a file (undecodable bytes replaced)."""

    @abstractmethod
    def write_file(self, path: str, text: str) -> None:
        """Write a text file, creating its parent directories."""

    @abstractmethod
    def remove_file(self, path: str) -> None:
        """Delete a file (undoing a ``create``)."""

    @abstractmethod
    def path_kind(self, path: str) -> str | None:
        """``"file"``, ``"dir"`` or ``None`` when nothing is there."""

    @abstractmethod
    def list_dir(self, path: str, depth: int = 2) -> list[str]:
        """Non-hidden files and directories under ``path``, ``depth`` levels down, sorted."""

    @abstractmethod
    def diff(self) -> str:
        """The agent's changes against the base commit, new files included (SWE-agent's submit:
        ``git add -A`` then ``git diff --cached``), in full, wherever the shell has wandered."""

    @abstractmethod
    def evaluate(self, instance: dict[str, Any], patch: str, log_dir: Path,
                 timeout: float) -> Path | None:
        """Grade ``patch`` on a pristine copy of the instance: return the test log's path, or
        ``None`` when the patch did not apply."""

    @abstractmethod
    def close(self) -> None:
        """Free every process, container and temporary directory."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ----------------------------------------------------------------------------- local
def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_local(groups: set[int], checkout: Path, root: Path) -> None:
    for pgid in groups:
        _kill_group(pgid)
    groups.clear()
    shutil.rmtree(checkout, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


def _run_git(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "crl", "GIT_AUTHOR_EMAIL": "crl@localhost",
           "GIT_COMMITTER_NAME": "crl", "GIT_COMMITTER_EMAIL": "crl@localhost",
           "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}
    done = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SandboxError(f"`git {' '.join(args)}` failed in {cwd}: "
                           f"{(done.stderr or done.stdout).strip()}")


def init_repo_from_files(source: Path, dest: Path) -> str:
    """Copy the files of ``source`` to ``dest`` and commit them as one deterministic commit.

    The author, committer and dates are fixed, so the same files always give the same commit
    hash: the toy task's ``base_commit`` is that hash. Returns it.
    """
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _run_git(["init", "-q", "-b", "main"], dest)
    _run_git(["add", "-A"], dest)
    _run_git(["-c", "commit.gpgsign=false", "commit", "-q", "--allow-empty", "--no-verify",
              "-m", "base"], dest)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=dest, capture_output=True,
                          text=True, check=True).stdout.strip()


class LocalSandbox(Sandbox):
    """A temporary git checkout on this host (opt-in: nothing isolates the agent's commands).

    ``source`` is a directory of plain files (committed as the base commit, the toy task's way)
    or an existing git repository (cloned, then ``base_commit`` checked out). File paths must
    resolve inside the checkout: ``..`` and symlinks that lead out are refused. A command's
    timeout kills its whole process group; output is cut to ``OUTPUT_LIMIT`` characters.

    Example:
        >>> import tempfile, pathlib, warnings
        >>> src = pathlib.Path(tempfile.mkdtemp()); _ = (src / "a.txt").write_text("hi\\n")
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     box = LocalSandbox(src)
        >>> box.run("cat a.txt && cd /tmp", timeout=10).output
        'hi\\n'
        >>> box.run("pwd", timeout=10).output
        '/tmp\\n'
        >>> box.close()
    """

    def __init__(self, source: str | os.PathLike, base_commit: str | None = None,
                 workdir: str | os.PathLike | None = None,
                 env: dict[str, str] | None = None) -> None:
        warnings.warn(
            "LocalSandbox runs the agent's commands on this host, unisolated, with your user's "
            "permissions; use DockerSandbox for untrusted agents.",
            UnisolatedSandboxWarning, stacklevel=2,
        )
        source = Path(source)
        if not source.is_dir():
            raise SandboxError(f"LocalSandbox source {source} is not a directory.")
        # Private files (shell state, grading clones) live apart from the checkout, which is
        # ``workdir`` when given (a fixed place keeps observations the same for the same seed).
        self._root = Path(tempfile.mkdtemp(prefix="crl-swe-"))
        self._state_dir = self._root / "shell"
        self._state_dir.mkdir()
        checkout = Path(workdir) if workdir is not None else self._root / "testbed"
        if checkout.exists():
            shutil.rmtree(self._root, ignore_errors=True)
            raise SandboxError(f"LocalSandbox workdir {checkout} already exists.")
        try:
            if (source / ".git").exists():
                _run_git(["clone", "-q", "--no-hardlinks", str(source), str(checkout)], self._root)
                if base_commit:
                    _run_git(["checkout", "-q", base_commit], checkout)
            else:
                init_repo_from_files(source, checkout)
        except BaseException:
            shutil.rmtree(checkout, ignore_errors=True)
            shutil.rmtree(self._root, ignore_errors=True)
            raise
        self._checkout = checkout.resolve()
        self.base_commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=self._checkout,
                                          capture_output=True, text=True).stdout.strip()
        self.repo_dir = str(self._checkout)
        # The interpreter running this library comes first on PATH, so `python` and `pytest` in
        # the agent's commands and in the eval script are the ones that have the dependencies.
        # Only a few variables of this process pass on: the agent sees no tokens or keys.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        passed = {key: value for key, value in os.environ.items() if key in _PASSED_ENV}
        self._env = {**passed, "PATH": path, "PAGER": "cat", "GIT_PAGER": "cat",
                     "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        self._groups: set[int] = set()
        # Runs on close(), or when the sandbox is collected or the interpreter exits unclosed.
        self._finalizer = weakref.finalize(self, _remove_local, self._groups, self._checkout,
                                           self._root)

    # -- shell
    def run(self, command: str, timeout: float) -> CommandResult:
        return self._execute(["bash", "-c", _SHELL_WRAPPER, "bash", str(self._state_dir), command],
                             timeout, cwd=self._checkout)

    def _execute(self, argv: list[str], timeout: float, cwd: Path) -> CommandResult:
        try:
            proc = subprocess.Popen(argv, cwd=cwd, env=self._env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except (OSError, ValueError) as err:  # E2BIG, a vanished checkout, a NUL byte
            raise SandboxError(f"could not start the command: {err}") from err
        self._groups.add(proc.pid)
        kept, total, timed_out = bytearray(), 0, False
        deadline, finished_at = time.monotonic() + timeout, None
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    self._kill_group(proc.pid)
                    break
                if proc.poll() is not None and finished_at is None:
                    # A background job may hold the pipe open after the shell is done: read
                    # what is already there, briefly, then stop.
                    finished_at = time.monotonic()
                if finished_at is not None and time.monotonic() - finished_at > 0.05:
                    break
                if not selector.select(timeout=min(left, 0.05)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                total += len(chunk)
                if len(kept) < _READ_CAP:
                    kept += chunk[: _READ_CAP - len(kept)]
        proc.stdout.close()
        exit_code = proc.wait()
        if exit_code < 0:  # killed by a signal: report it as a shell does (128 + N)
            exit_code = 128 - exit_code
        text = kept.decode("utf-8", errors="replace")
        output = cut_output(text, total=total if total > len(kept) else None)
        if timed_out:
            return CommandResult(output, None, timed_out=True)
        return CommandResult(output, exit_code)

    def _kill_group(self, pgid: int) -> None:
        _kill_group(pgid)

    # -- files
    def check_path(self, path: str) -> str:
        if not os.path.isabs(path):
            raise PathOutsideSandboxError(f"The path {path!r} is not absolute.")
        real = os.path.realpath(path)
        if os.path.commonpath([real, str(self._checkout)]) != str(self._checkout):
            raise PathOutsideSandboxError(
                f"The path {path} resolves to {real}, outside the repository {self.repo_dir}; "
                "the editor only touches files inside it."
            )
        return real

    def read_file(self, path: str) -> str:
        # newline="": line endings stay as they are (CRLF files must not be rewritten as LF)
        with open(self.check_path(path), encoding="utf-8", errors="replace", newline="") as handle:
            return handle.read()

    def write_file(self, path: str, text: str) -> None:
        target = Path(self.check_path(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.crl-tmp")
        with open(tmp, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        if target.exists():
            shutil.copymode(target, tmp)  # an edited script stays executable
        os.replace(tmp, target)

    def diff(self) -> str:
        command = _DIFF_COMMAND.format(base=self.base_commit)
        done = subprocess.run(["bash", "-c", command], cwd=self._checkout, env=self._env,
                              capture_output=True)
        return done.stdout.decode("utf-8", errors="replace") if done.returncode == 0 else ""

    def remove_file(self, path: str) -> None:
        Path(self.check_path(path)).unlink(missing_ok=True)

    def path_kind(self, path: str) -> str | None:
        real = Path(self.check_path(path))
        return "dir" if real.is_dir() else "file" if real.is_file() else None

    def list_dir(self, path: str, depth: int = 2) -> list[str]:
        root = Path(self.check_path(path))
        found = []
        for current, dirs, files in os.walk(root):
            level = len(Path(current).relative_to(root).parts)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            if level >= depth:
                dirs[:] = []
            for name in dirs + sorted(f for f in files if not f.startswith(".")):
                found.append(os.path.join(path, os.path.relpath(os.path.join(current, name), root)))
        return sorted(found)

    # -- grading
    def evaluate(self, instance: dict[str, Any], patch: str, log_dir: Path,
                 timeout: float) -> Path | None:
        """Clone the base commit afresh, apply ``patch`` as swebench does, run the eval script.

        The row's ``eval_script`` is written for ``/testbed``; here ``/testbed`` is the fresh
        clone. Rows of the real benchmark also expect their image's conda env, so on the host
        only tasks written for it (the toy) grade meaningfully; real ones need DockerSandbox.
        """
        from swebench.harness.constants import APPLY_PATCH_FAIL, APPLY_PATCH_PASS

        log_dir.mkdir(parents=True, exist_ok=True)
        pristine = self._root / f"eval-{uuid.uuid4().hex[:8]}"
        _run_git(["clone", "-q", "--no-hardlinks", str(self._checkout), str(pristine)], self._root)
        _run_git(["checkout", "-q", instance["base_commit"]], pristine)
        try:
            patch_file = log_dir / "patch.diff"
            patch_file.write_text(patch)
            applied = None
            for command in _APPLY_COMMANDS:
                done = subprocess.run([*command, str(patch_file)], cwd=pristine,
                                      capture_output=True, text=True)
                if done.returncode == 0:
                    applied = done.stdout + done.stderr
                    break
                subprocess.run(["git", "checkout", "--", "."], cwd=pristine, capture_output=True)
                subprocess.run(["git", "clean", "-fdq"], cwd=pristine, capture_output=True)
            (log_dir / "run_instance.log").write_text(
                f"{APPLY_PATCH_PASS}:\n{applied}" if applied is not None
                else f"{APPLY_PATCH_FAIL}\n"
            )
            if applied is None:
                return None
            from swebench.harness.utils import make_test_spec

            script = make_test_spec(instance).eval_script.replace(CONTAINER_REPO, str(pristine))
            eval_file = log_dir / "eval.sh"
            eval_file.write_text(script)
            # The whole log goes to the file: the grader needs every line, unlike an agent.
            log = log_dir / "test_output.txt"
            with open(log, "wb") as handle:
                proc = subprocess.Popen(["bash", str(eval_file)], cwd=pristine, env=self._env,
                                        stdin=subprocess.DEVNULL, stdout=handle,
                                        stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    from swebench.harness.constants import TESTS_TIMEOUT

                    self._kill_group(proc.pid)
                    proc.wait()
                    handle.write(f"\n{TESTS_TIMEOUT}: {timeout} seconds exceeded.\n".encode())
            return log
        finally:
            shutil.rmtree(pristine, ignore_errors=True)

    def close(self) -> None:
        self._finalizer()


# ----------------------------------------------------------------------------- docker
def docker_client() -> Any:
    """A docker SDK client for the local daemon, or ``SandboxError`` saying what is missing."""
    try:
        import docker
    except ImportError as err:
        raise SandboxError(
            "DockerSandbox needs the docker SDK: pip install 'crl-gym[swebench]'."
        ) from err
    try:
        client = docker.from_env(timeout=1800)
        client.ping()
    except Exception as err:  # the SDK raises several types for "no daemon"
        raise SandboxError(
            "DockerSandbox needs a running Docker daemon (none answered at $DOCKER_HOST or the "
            f"default socket: {err}). Start Docker, or use sandbox='local' for trusted tasks."
        ) from err
    return client


def _remove_container(container: Any) -> None:
    try:
        container.remove(force=True)
    except Exception as err:  # already gone, or the daemon went away
        warnings.warn(f"Could not remove container {container.id}: {err}", stacklevel=2)


class DockerSandbox(Sandbox):
    """A container of the instance's SWE-bench image, with the repository at ``/testbed``.

    The image is the row's ``image`` field (swebench 5.x; pulled if absent). Commands run
    through ``exec`` as ``timeout --kill-after=5 T bash -c WRAPPER``, so a timeout kills the
    command's process group inside the container; files move as tar archives
    (``put_archive``) and ``cat``. Grading hands the patch to swebench's official
    ``run_instance``, which starts a fresh container from the same image.
    """

    def __init__(self, instance: dict[str, Any], client: Any = None,
                 run_id: str | None = None) -> None:
        self.client = client if client is not None else docker_client()
        self.image = instance["image"]
        self.instance_id = instance["instance_id"]
        self.base_commit = instance.get("base_commit", "HEAD")
        self.run_id = run_id or f"crl-{uuid.uuid4().hex[:8]}"
        self.repo_dir = CONTAINER_REPO
        self._state_dir = "/tmp/.crl_shell"
        try:
            self.client.images.get(self.image)
        except Exception:
            try:
                self.client.images.pull(self.image)
            except Exception as err:
                raise SandboxError(
                    f"Docker image {self.image} for {self.instance_id} is neither local nor "
                    f"pullable ({err}). Build it with `python -m swebench.harness.prepare_images "
                    f"--instance_ids {self.instance_id}` or `docker pull {self.image}`."
                ) from err
        self.container = self.client.containers.run(
            self.image, command="tail -f /dev/null", detach=True, user="root",
            working_dir=CONTAINER_REPO,
            name=f"crl.{self.instance_id.lower()}.{self.run_id}",
        )
        # Runs on close(), or when the sandbox is collected or the interpreter exits unclosed.
        self._finalizer = weakref.finalize(self, _remove_container, self.container)
        self._exec(["mkdir", "-p", self._state_dir], timeout=30)
        # What an interactive shell would read: SWE-bench images activate the `testbed` conda
        # env in /root/.bashrc, and SWE-agent's interactive session starts from it.
        self.run("source ~/.bashrc >/dev/null 2>&1; true", timeout=120)

    def _exec(self, argv: list[str], timeout: float) -> CommandResult:
        api = self.client.api
        seconds = max(1, int(timeout))
        wrapped = ["timeout", "--kill-after=5", str(seconds), *argv]
        started = time.monotonic()
        exec_id = api.exec_create(self.container.id, wrapped, workdir=CONTAINER_REPO,
                                  user="root", environment={"PAGER": "cat", "GIT_PAGER": "cat",
                                                            "TERM": "dumb"})["Id"]
        kept, total = bytearray(), 0
        for chunk in api.exec_start(exec_id, stream=True):
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
        return self._exec(["bash", "-c", _SHELL_WRAPPER, "bash", self._state_dir, command], timeout)

    def check_path(self, path: str) -> str:
        if not path.startswith("/"):
            raise PathOutsideSandboxError(f"The path {path!r} is not absolute.")
        return str(PurePosixPath(path))

    def diff(self) -> str:
        patch_file = "/tmp/.crl_submission.diff"
        command = _DIFF_COMMAND.format(base=self.base_commit)
        result = self._exec(["bash", "-c", f"{command} > {patch_file}"], timeout=120)
        return self.read_file(patch_file) if result.exit_code == 0 else ""

    def read_file(self, path: str) -> str:
        # get_archive, not `cat` through exec: file contents must not be cut like output.
        try:
            stream, _ = self.container.get_archive(self.check_path(path))
        except Exception as err:  # docker.errors.NotFound and friends
            raise FileNotFoundError(f"{path}: {err}") from err
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.next()
            handle = tar.extractfile(member) if member is not None else None
            if handle is None:
                raise FileNotFoundError(f"{path} is not a regular file")
            return handle.read().decode("utf-8", errors="replace")

    def write_file(self, path: str, text: str) -> None:
        target = PurePosixPath(self.check_path(path))
        data = text.encode("utf-8")
        # mkdir, and the mode of the file being replaced (an edited script stays executable)
        mode = self._exec(["bash", "-c", 'mkdir -p -- "$(dirname -- "$1")" && '
                           '{ stat -c %a -- "$1" 2>/dev/null || echo 644; }', "bash", str(target)],
                          timeout=30).output.strip()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            member = tarfile.TarInfo(name=target.name)
            member.size = len(data)
            member.mtime = int(time.time())
            member.mode = int(mode, 8) if mode.isdigit() else 0o644
            tar.addfile(member, io.BytesIO(data))
        self.container.put_archive(str(target.parent), buffer.getvalue())

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
        run_instance(make_test_spec(instance), prediction, self.client, run_id,
                     timeout=int(timeout))
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

    def close(self) -> None:
        finalizer = getattr(self, "_finalizer", None)  # absent when the container never started
        if finalizer is not None:
            finalizer()
