"""Where an SWE task's repository lives and its commands run: one interface, two sandboxes.

Holds:
- ``CommandResult``: what one shell command produced (bounded output, exit code, timeout flag).
- ``Sandbox``: the interface the tools and the env use (shell, files, diff, grading run).
- ``LocalSandbox``: a temporary git checkout on this host. Opt-in: commands run unisolated.
- ``DockerSandbox``: a container of the instance's SWE-bench image, repository at ``/testbed``,
  driven through the docker SDK; graded by swebench's own ``run_instance``.
- ``ContainerLimits``: what its containers may use (hardened defaults: no network, memory and
  process limits); ``sandbox_labels``, ``SANDBOX_LABEL`` and ``remove_stale_containers``: the
  labels that let a later run remove the containers of a killed process; ``ensure_image``.
- ``PathOutsideSandboxError``, ``SandboxError``, ``UnisolatedSandboxWarning``.

The shell is persistent in the sense of SWE-agent: the working directory, shell and exported
variables, functions and aliases carry over from one command to the next. Each command runs as
a fresh ``bash`` that first restores that state and saves it on exit, so a timeout can kill
everything the command started without losing the session. The state travels through pipes
and lives in this process, where the agent's commands cannot delete or rewrite it.

The sandboxes assume an adversarial agent (an RL policy searching for holes): see
docs/threat-model.md. In short, ``LocalSandbox`` is no security boundary; it only keeps an
honest agent from harming the host by accident and keeps the grading and the tools from being
subverted through files of the checkout (git configuration, symlinks, oversized files).
"""

from __future__ import annotations

import errno
import functools
import io
import os
import queue
import selectors
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
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
    "ContainerLimits",
    "SANDBOX_LABEL",
    "ensure_image",
    "remove_stale_containers",
    "sandbox_labels",
    "SandboxError",
    "PathOutsideSandboxError",
    "FileTooLargeError",
    "UnisolatedSandboxWarning",
    "OUTPUT_LIMIT",
    "MAX_PATCH_BYTES",
    "cut_output",
]

# SWE-agent's observation cap: longer tool output is cut, with a marker saying so.
OUTPUT_LIMIT = 16_000
# Bytes kept from a command's output stream before the rest is only counted (memory bound).
_READ_CAP = 4 * OUTPUT_LIMIT

# The eval scripts of SWE-bench put the repository here; observations name it.
CONTAINER_REPO = "/testbed"

# Writes the session (shell and exported variables, functions, aliases, cwd) to fd 3, ending
# with _STATE_END. It runs after the command and on `exit`, in the command's own shell, so it
# first removes functions the command may have defined over the builtins it uses: in POSIX mode
# (entered by an assignment, which no function can intercept) `unset` is found before functions.
# Bash's own dynamic and read-only variables are not saved.
_STATE_END = "# crl-state-end"
_SAVER = r"""POSIXLY_CORRECT=y
unset -f builtin command declare alias compgen printf set shopt trap exit eval
unset POSIXLY_CORRECT
{
  for __crl_v in $(builtin compgen -v); do
    case $__crl_v in
      __crl_*|BASH|BASH[_O]*|BASHPID|COMP_*|DIRSTACK|EPOCH*|EUID|FUNCNAME|GROUPS|HISTCMD|\
      LINENO|OPTIND|PIPESTATUS|POSIXLY_CORRECT|PPID|PWD|RANDOM|SECONDS|SHELLOPTS|SHLVL|\
      SRANDOM|UID|_) ;;
      *) builtin declare -p "$__crl_v" ;;
    esac
  done
  builtin declare -f; builtin alias -p
  builtin printf 'builtin cd -- %q\n' "$PWD"
  builtin printf '%s\n' '""" + _STATE_END + r"""'
} >&3 2>/dev/null"""

# Restores the session read from stdin, runs the command with stdin closed (an interactive
# program must not wait for input that never comes) and without fd 3, then saves the session,
# on `exit N` too; the exit status stays the command's. An EXIT trap the command sets is
# dropped, as a persistent shell would run it only when the session ends.
_SHELL_WRAPPER = rf"""
__crl_cmd=$1; set --
__crl_env=$(< /dev/stdin); exec < /dev/null
shopt -s expand_aliases
if [ -n "$__crl_env" ]; then
  unset $(compgen -e) 2>/dev/null  # the saved session's environment, not the inherited one
  eval "$__crl_env" 2>/dev/null
fi
unset __crl_env
trap {shlex.quote(_SAVER)} EXIT
eval "$__crl_cmd" 3>&-
__crl_rc=$?
{_SAVER}
trap - EXIT
exit $__crl_rc
"""
# A saved session larger than this is not kept (the previous one is): it is held in memory.
_STATE_LIMIT = 8_000_000

# The largest submission that is graded (bytes). SWE-bench's gold patches are a few KB; a diff
# of megabytes is a generated or vendored file, and applying and grading it costs the host.
MAX_PATCH_BYTES = 1_000_000

# Configuration the agent could have set in the repository's .git/config and that makes git run
# its commands or wait on them; the command line wins over every config file. (External diff
# drivers and textconv filters are switched off by _DIFF_ARGS.)
_GIT_GUARDS = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
               "-c", "core.untrackedCache=false", "-c", "core.pager=cat")
# Against the base commit, not HEAD: changes the agent has committed are part of its answer.
_DIFF_ARGS = ("-c", "core.fileMode=false", "diff", "--cached", "--no-color", "--no-ext-diff",
              "--no-textconv")
_GIT_TIMEOUT = 120.0
# The largest file (the test log included) a LocalSandbox grading run may write, in KiB.
_EVAL_FILE_LIMIT_KB = 200 * 1024

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
    """A file path resolves (through ``..`` or symlinks) outside the sandbox's checkout, or
    passes through a symlink, which the file methods of ``LocalSandbox`` never follow."""


class FileTooLargeError(ValueError):
    """A file is larger than the caller will load; the message says what to use instead."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path} is {size:,} bytes; the editor loads files of up to {limit:,} "
                         "bytes. Use bash (grep -n, sed -n '10,40p', sed -i) on larger files.")


class UnisolatedSandboxWarning(UserWarning):
    """``LocalSandbox`` runs the agent's commands on this host, with the user's permissions
    (shown once a process)."""


@functools.cache
def _warn_unisolated() -> None:
    """Warn about ``LocalSandbox`` once a process: every env reset opens one, and Python's own
    once-per-place memory is wiped whenever the warning filters change, which every subprocess
    start does (``os.get_exec_path``), so a filter action of "once" would not hold."""
    warnings.warn(
        "LocalSandbox runs the agent's commands on this host, unisolated, with your user's "
        "permissions; use DockerSandbox for untrusted agents.",
        UnisolatedSandboxWarning, stacklevel=3,  # the code that made the LocalSandbox
    )


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
    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        """The text of a file. Bytes that are not UTF-8 come back as surrogate escapes, so
        ``write_file`` writes them back unchanged. ``FileTooLargeError`` above ``max_bytes``."""

    @abstractmethod
    def write_file(self, path: str, text: str) -> None:
        """Write a text file (surrogate escapes as the bytes they stand for), creating its
        parent directories."""

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
        ``git add -A`` then ``git diff --cached``), wherever the shell has wandered: in full up
        to ``MAX_PATCH_BYTES``, cut just past it when larger (grading refuses it then)."""

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
# Runs each LocalSandbox command: it becomes the child subreaper of everything the command
# starts, so processes that leave the command's process group or session (setsid, a double
# fork) are re-parented to it rather than to init and stay findable. It reports the command's
# exit status on a pipe, then stays until its last descendant is gone; on SIGTERM it kills its
# whole subtree. So a timeout or close() ends every process of the command, and only those.
_REAPER = r"""
import os, signal, sys
status_fd, state_fd, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
try:
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass

def descendants():
    children = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: only the process group can be reached (below)
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, "rb") as handle:
                    parent = int(handle.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, frontier = [], [os.getpid()]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found += kids
        frontier += kids
    return found

def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return

def kill_all(*_):
    for _ in range(200):
        pids = descendants()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        reap()
    os.killpg(0, signal.SIGKILL)  # and what is left of the command's group, this process too

signal.signal(signal.SIGTERM, kill_all)
child = os.fork()
if child == 0:
    try:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; the command must not
        if state_fd >= 0:
            os.dup2(state_fd, 3)
        for fd in {status_fd, state_fd} - {-1, 3}:
            os.close(fd)
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
if state_fd >= 0:
    os.close(state_fd)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        break
    if pid == child:
        os.write(status_fd, str(os.waitstatus_to_exitcode(status)).encode())
        os.close(status_fd)
"""


class _Supervised:
    """One command under ``_REAPER``: the reaper's process and the read ends of the status and
    shell-state pipes. Signals go only to the reaper while it is an unreaped child of ours, so
    its pid, and the process group it leads, cannot belong to anyone else."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], stdout: Any,
                 with_state: bool) -> None:
        status_r, status_w = os.pipe()
        state_r, state_w = os.pipe() if with_state else (-1, -1)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _REAPER, str(status_w), str(state_w), *argv],
                cwd=cwd, env=env, stdin=subprocess.PIPE if with_state else subprocess.DEVNULL,
                stdout=stdout, stderr=subprocess.STDOUT, start_new_session=True,
                pass_fds=[fd for fd in (status_w, state_w) if fd >= 0])
        except BaseException:
            for fd in (status_r, state_r):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in (status_w, state_w):
                if fd >= 0:
                    os.close(fd)
        self.status_fd, self.state_fd = status_r, state_r

    def send_state(self, state: bytes) -> None:
        try:
            self.proc.stdin.write(state)
            self.proc.stdin.close()
        except BrokenPipeError:  # the shell is already gone
            pass

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """End the command and every process it started."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            # Not yet reaped, so the group the reaper leads is still this command's.
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _read_available(fd: int, limit: int) -> bytes:
    """What a pipe holds now, up to ``limit`` bytes, without waiting for more."""
    os.set_blocking(fd, False)
    data = bytearray()
    try:
        while len(data) < limit and (chunk := os.read(fd, 65536)):
            data += chunk
    except BlockingIOError:
        pass
    return bytes(data[:limit])


def _drain(fd: int) -> None:
    """Read and drop what background jobs write after their command returned, so they neither
    die of SIGPIPE nor block on a full pipe; ends when the last of them closes the pipe."""
    try:
        while os.read(fd, 65536):
            pass
    finally:
        os.close(fd)


def _remove_local(commands: set[_Supervised], checkout: Path, root: Path) -> None:
    for command in list(commands):
        command.stop()
    commands.clear()
    shutil.rmtree(checkout, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


def _git_env(home: Path | None = None) -> dict[str, str]:
    """The environment of git runs this library makes: no system or user configuration (whose
    filters, hooks or autocrlf would change commits and diffs), fixed identity and dates."""
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(home or tempfile.gettempdir()),
            "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": "crl",
            "GIT_AUTHOR_EMAIL": "crl@localhost", "GIT_COMMITTER_NAME": "crl",
            "GIT_COMMITTER_EMAIL": "crl@localhost", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z"}


def _run_git(args: list[str], cwd: Path, timeout: float = 600.0,
             env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(["git", *_GIT_GUARDS, *args], cwd=cwd, env=env or _git_env(),
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as err:
        raise SandboxError(f"`git {' '.join(args)}` took over {timeout:g} s in {cwd}.") from err
    if done.returncode != 0:
        raise SandboxError(f"`git {' '.join(args)}` failed in {cwd}: "
                           f"{(done.stderr or done.stdout).strip()}")
    return done.stdout


def _run_capped(argv: list[str], cwd: Path, env: dict[str, str], timeout: float,
                limit: int) -> tuple[int | None, bytes]:
    """Run ``argv``; its exit code (``None`` on timeout) and at most ``limit + 1`` bytes of its
    stdout: a process that writes more is killed, so memory stays bounded."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        kept, deadline = bytearray(), time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while len(kept) <= limit and time.monotonic() < deadline:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                kept += chunk
        finished = len(kept) <= limit and time.monotonic() < deadline
        try:
            code = proc.wait(timeout=max(0.1, deadline - time.monotonic())) if finished else None
        except subprocess.TimeoutExpired:  # closed its output but did not exit
            code = None
        if code is None:
            proc.kill()
            proc.wait()
    return code, bytes(kept[: limit + 1])


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
    return _run_git(["rev-parse", "HEAD"], dest).strip()


class LocalSandbox(Sandbox):
    """A temporary git checkout on this host (opt-in: nothing isolates the agent's commands).

    ``source`` is a directory of plain files (committed as the base commit, the toy task's way)
    or an existing git repository (cloned, then ``base_commit`` checked out). A private bare
    copy of the base commit, outside the checkout, is what ``diff`` compares against and what
    grading clones, so nothing the agent does to the checkout's ``.git`` (configuration, hooks,
    objects) runs or counts there. File methods resolve paths inside the checkout one component
    at a time without following symlinks (``O_NOFOLLOW`` under a directory descriptor), so a
    link swapped in after a check cannot lead out. Each command runs under a reaper process, so
    a timeout kills everything it started, ``setsid`` and orphans included; output is cut to
    ``OUTPUT_LIMIT`` characters.

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
        _warn_unisolated()
        source = Path(source)
        if not source.is_dir():
            raise SandboxError(f"LocalSandbox source {source} is not a directory.")
        # Private files (the base repository, its index, grading clones) live apart from the
        # checkout, which is ``workdir`` when given (a fixed place keeps observations the same
        # for the same seed).
        self._root = Path(tempfile.mkdtemp(prefix="crl-swe-"))
        self._git_dir = self._root / "base.git"
        checkout = Path(workdir) if workdir is not None else self._root / "testbed"
        if checkout.exists():
            shutil.rmtree(self._root, ignore_errors=True)
            raise SandboxError(f"LocalSandbox workdir {checkout} already exists.")
        try:
            if (source / ".git").exists():
                _run_git(["clone", "-q", "--bare", str(source), str(self._git_dir)], self._root)
                _run_git(["clone", "-q", "--no-hardlinks", str(self._git_dir), str(checkout)],
                         self._root)
                if base_commit:
                    _run_git(["checkout", "-q", base_commit], checkout)
            else:
                init_repo_from_files(source, checkout)
                _run_git(["clone", "-q", "--bare", "--no-hardlinks", str(checkout),
                          str(self._git_dir)], self._root)
            self.base_commit = _run_git(["rev-parse", "HEAD"], checkout).strip()
            # The private index starts as the base commit, as the checkout's own does, so files
            # the agent's .gitignore names stay tracked (upstream's `git add -A` semantics).
            _run_git(["read-tree", self.base_commit], self._root,
                     env={**_git_env(self._root), **self._git_env_of(checkout)})
        except BaseException:
            shutil.rmtree(checkout, ignore_errors=True)
            shutil.rmtree(self._root, ignore_errors=True)
            raise
        self._checkout = checkout.resolve()
        self.repo_dir = str(self._checkout)
        # The interpreter running this library comes first on PATH, so `python` and `pytest` in
        # the agent's commands and in the eval script are the ones that have the dependencies.
        # Only a few variables of this process pass on: the agent sees no tokens or keys.
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        passed = {key: value for key, value in os.environ.items() if key in _PASSED_ENV}
        self._env = {**passed, "PATH": path, "PAGER": "cat", "GIT_PAGER": "cat",
                     "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
        self._shell_state = b""
        self._commands: set[_Supervised] = set()
        # Runs on close(), or when the sandbox is collected or the interpreter exits unclosed.
        self._finalizer = weakref.finalize(self, _remove_local, self._commands, self._checkout,
                                           self._root)

    # -- shell
    def run(self, command: str, timeout: float) -> CommandResult:
        result, state = self._execute(["bash", "-c", _SHELL_WRAPPER, "bash", command], timeout,
                                      cwd=self._checkout, state=self._shell_state)
        # A session that was cut short (timeout, a kill, a broken saver) keeps the last good one.
        if state.rstrip(b"\n").endswith(_STATE_END.encode()) and len(state) <= _STATE_LIMIT:
            self._shell_state = state
        return result

    def _execute(self, argv: list[str], timeout: float, cwd: Path,
                 state: bytes) -> tuple[CommandResult, bytes]:
        for done in [command for command in self._commands if not command.running()]:
            self._commands.discard(done)
        try:
            command = _Supervised(argv, cwd, self._env, stdout=subprocess.PIPE, with_state=True)
        except (OSError, ValueError) as err:  # E2BIG, a vanished checkout, a NUL byte
            raise SandboxError(f"could not start the command: {err}") from err
        self._commands.add(command)
        command.send_state(state)
        output_fd = command.proc.stdout.fileno()
        kept, total, saved, status = bytearray(), 0, bytearray(), bytearray()
        timed_out, finished_at, open_fds = False, None, {output_fd, command.state_fd}
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for fd in (output_fd, command.state_fd, command.status_fd):
                selector.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    command.stop()
                    break
                # Done: the shell has exited, its session is written; background jobs may hold
                # the output pipe (and a copy of the state pipe, as forked subshells inherit the
                # descriptor bash saved it to), so what they write is read briefly, then left.
                if finished_at is not None and (
                        output_fd not in open_fds or time.monotonic() - finished_at > 0.05):
                    break
                for key, _ in selector.select(timeout=min(left, 0.05)):
                    chunk = os.read(key.fd, 65536)
                    if key.fd == command.status_fd:
                        status += chunk
                        if not chunk:
                            finished_at = time.monotonic()
                            selector.unregister(key.fd)
                    elif not chunk:
                        selector.unregister(key.fd)
                        open_fds.discard(key.fd)
                    elif key.fd == command.state_fd:
                        if len(saved) <= _STATE_LIMIT:
                            saved += chunk
                    else:
                        total += len(chunk)
                        if len(kept) < _READ_CAP:
                            kept += chunk[: _READ_CAP - len(kept)]
        os.close(command.status_fd)
        if finished_at is not None and command.state_fd in open_fds:
            saved += _read_available(command.state_fd, _STATE_LIMIT + 1 - len(saved))
        os.close(command.state_fd)
        output_pipe = os.dup(output_fd)
        command.proc.stdout.close()
        if output_fd in open_fds and command.running():
            threading.Thread(target=_drain, args=(output_pipe,), daemon=True,
                             name="crl-sandbox-drain").start()
        else:
            os.close(output_pipe)
        text = kept.decode("utf-8", errors="replace")
        output = cut_output(text, total=total if total > len(kept) else None)
        if timed_out or not status:
            return CommandResult(output, None, timed_out=timed_out), b""
        exit_code = int(status)
        if exit_code < 0:  # killed by a signal: report it as a shell does (128 + N)
            exit_code = 128 - exit_code
        return CommandResult(output, exit_code), bytes(saved)

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

    def _parts(self, path: str) -> list[str]:
        """The components of ``path`` below the checkout, from its text alone (no lookup)."""
        normal = os.path.normpath(path)
        if not os.path.isabs(path) or os.path.commonpath([normal, str(self._checkout)]) \
                != str(self._checkout):
            raise PathOutsideSandboxError(
                f"The path {path} is outside the repository {self.repo_dir}; the editor only "
                "touches files inside it.")
        return [part for part in os.path.relpath(normal, self._checkout).split(os.sep)
                if part != "."]

    def _open_parent(self, path: str, create: bool = False) -> tuple[int, str]:
        """A descriptor of the directory holding ``path`` and the last component's name, reached
        from the checkout one component at a time without following a symlink (``O_NOFOLLOW``):
        a link swapped in at any moment makes the open fail rather than lead out."""
        parts = self._parts(path)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self._checkout, flags)
        try:
            for part in parts[:-1]:
                try:
                    next_fd = os.open(part, flags, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, dir_fd=fd)
                    next_fd = os.open(part, flags, dir_fd=fd)
                except OSError as err:
                    if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    if stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode):
                        raise self._link_error(path, err) from err
                    raise FileNotFoundError(errno.ENOENT, "a component is a file", path) from err
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        return fd, (parts[-1] if parts else ".")

    def _link_error(self, path: str, err: BaseException) -> BaseException:
        if isinstance(err, OSError) and err.errno in (errno.ELOOP, errno.ENOTDIR):  # a link
            return PathOutsideSandboxError(
                f"The path {path} passes through a symbolic link; the editor does not follow "
                "links. Edit the file the link points to.")
        return err

    def _lstat(self, path: str) -> os.stat_result | None:
        try:
            parent, name = self._open_parent(path)
        except FileNotFoundError:
            return None
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(parent)

    def read_file(self, path: str, max_bytes: int | None = None) -> str:
        parent, name = self._open_parent(path)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                         dir_fd=parent)
        except OSError as err:
            raise self._link_error(path, err) from err
        finally:
            os.close(parent)
        with open(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise OSError(f"{path} is not a regular file")
            if max_bytes is not None and info.st_size > max_bytes:
                raise FileTooLargeError(path, info.st_size, max_bytes)
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:  # it grew while we read
            raise FileTooLargeError(path, len(data), max_bytes)
        # surrogateescape: bytes that are not UTF-8 survive a read and write unchanged
        return data.decode("utf-8", errors="surrogateescape")

    def write_file(self, path: str, text: str) -> None:
        data = text.encode("utf-8", errors="surrogateescape")
        parent, name = self._open_parent(path, create=True)
        tmp = f".{name}.crl-{uuid.uuid4().hex[:8]}"
        try:
            try:
                old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                old = None
            if old is not None and not stat.S_ISREG(old.st_mode):
                raise self._link_error(path, OSError(errno.ELOOP, "a symbolic link")) \
                    if stat.S_ISLNK(old.st_mode) else OSError(f"{path} is not a regular file")
            mode = stat.S_IMODE(old.st_mode) if old is not None else 0o644  # scripts stay executable
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         mode, dir_fd=parent)
            try:
                with open(fd, "wb") as handle:
                    os.fchmod(handle.fileno(), mode)  # exact, whatever the umask
                    handle.write(data)
                # replace() swaps directory entries: a link put at `name` meanwhile is replaced,
                # never written through
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=parent)
                except FileNotFoundError:
                    pass
                raise
        finally:
            os.close(parent)

    def _git_env_of(self, work_tree: Path) -> dict[str, str]:
        return {"GIT_DIR": str(self._git_dir), "GIT_WORK_TREE": str(work_tree),
                "GIT_INDEX_FILE": str(self._root / "index")}

    def diff(self) -> str:
        # The agent's working tree against the private base repository, with a private index:
        # the checkout's .git (its config, hooks, objects) takes no part.
        try:
            if not stat.S_ISDIR(os.lstat(self._checkout).st_mode):  # replaced, by a link to /
                return ""
        except FileNotFoundError:
            return ""
        env = {**_git_env(self._root), **self._git_env_of(self._checkout)}
        add, _ = _run_capped(["git", *_GIT_GUARDS, "add", "-A"], self._checkout, env,
                             _GIT_TIMEOUT, limit=0)
        if add != 0:
            return ""
        code, patch = _run_capped(["git", *_GIT_GUARDS, *_DIFF_ARGS, self.base_commit],
                                  self._checkout, env, _GIT_TIMEOUT, limit=MAX_PATCH_BYTES)
        if code is None and len(patch) <= MAX_PATCH_BYTES:  # timed out, not over the cap
            return ""
        return patch.decode("utf-8", errors="replace")

    def remove_file(self, path: str) -> None:
        parent, name = self._open_parent(path)
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        finally:
            os.close(parent)

    def path_kind(self, path: str) -> str | None:
        self.check_path(path)
        found = self._lstat(path)
        if found is None:
            return None
        if stat.S_ISLNK(found.st_mode):
            raise self._link_error(path, OSError(errno.ELOOP, "a symbolic link"))
        return "dir" if stat.S_ISDIR(found.st_mode) else "file" if stat.S_ISREG(found.st_mode) \
            else None

    def list_dir(self, path: str, depth: int = 2) -> list[str]:
        parent, name = self._open_parent(path)
        try:
            root = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=parent)
        except OSError as err:
            raise self._link_error(path, err) from err
        finally:
            os.close(parent)
        found = []
        try:
            for current, dirs, files, _ in os.fwalk(".", dir_fd=root):
                level = len(Path(current).parts)
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                if level >= depth:
                    dirs[:] = []
                for entry in dirs + sorted(f for f in files if not f.startswith(".")):
                    found.append(os.path.normpath(os.path.join(path, current, entry)))
        finally:
            os.close(root)
        return sorted(found)

    # -- grading
    def evaluate(self, instance: dict[str, Any], patch: str, log_dir: Path,
                 timeout: float) -> Path | None:
        """Clone the base commit afresh from the private base repository (never from the
        agent's checkout), apply ``patch`` as swebench does, run the eval script.

        The row's ``eval_script`` is written for ``/testbed``; here ``/testbed`` is the fresh
        clone. Rows of the real benchmark also expect their image's conda env, so on the host
        only tasks written for it (the toy) grade meaningfully; real ones need DockerSandbox.
        """
        from swebench.harness.constants import APPLY_PATCH_FAIL, APPLY_PATCH_PASS

        log_dir.mkdir(parents=True, exist_ok=True)
        pristine = self._root / f"eval-{uuid.uuid4().hex[:8]}"
        _run_git(["clone", "-q", "--no-hardlinks", str(self._git_dir), str(pristine)], self._root)
        _run_git(["checkout", "-q", instance["base_commit"]], pristine)
        try:
            patch_file = log_dir / "patch.diff"
            patch_file.write_text(patch)
            applied = None
            for command in _APPLY_COMMANDS:
                try:
                    done = subprocess.run([*command, str(patch_file)], cwd=pristine,
                                          env=_git_env(self._root), capture_output=True,
                                          text=True, timeout=_GIT_TIMEOUT,
                                          stdin=subprocess.DEVNULL)
                except subprocess.TimeoutExpired:
                    done = None
                if done is not None and done.returncode == 0:
                    applied = done.stdout + done.stderr
                    break
                _run_git(["checkout", "--", "."], pristine)
                _run_git(["clean", "-fdq"], pristine)
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
                self._run_eval(eval_file, pristine, handle, timeout)
            return log
        finally:
            shutil.rmtree(pristine, ignore_errors=True)

    def _run_eval(self, eval_file: Path, cwd: Path, log: Any, timeout: float) -> None:
        # The patched code runs here and may print without end: no file it writes, the log
        # included, grows past _EVAL_FILE_LIMIT_KB (the run dies of SIGXFSZ, graded unresolved).
        command = _Supervised(["bash", "-c", f'ulimit -f {_EVAL_FILE_LIMIT_KB} && exec bash "$0"',
                               str(eval_file)], cwd, self._env, stdout=log, with_state=False)
        self._commands.add(command)
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(command.status_fd, selectors.EVENT_READ)
                finished = bool(selector.select(timeout=timeout))
        finally:
            os.close(command.status_fd)
            command.stop()  # the script is done or late: nothing it started outlives grading
            self._commands.discard(command)
        if not finished:
            from swebench.harness.constants import TESTS_TIMEOUT

            log.write(f"\n{TESTS_TIMEOUT}: {timeout} seconds exceeded.\n".encode())

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


def _remove_container(container: Any) -> None:
    try:
        container.remove(force=True)
    except Exception as err:  # already gone, or the daemon went away
        warnings.warn(f"Could not remove container {container.id}: {err}", stacklevel=2)


@dataclass(frozen=True)
class ContainerLimits:
    """What a ``DockerSandbox`` container (the agent's and the grading one) may use.

    The defaults are the hardened ones: no network, 4 GB of memory and no swap beyond it,
    1024 processes, no privilege gain through setuid binaries.

    >>> ContainerLimits().run_kwargs()["network_mode"], ContainerLimits(network=True).run_kwargs()["network_mode"]
    ('none', 'bridge')
    """

    memory: str = "4g"
    """memory limit (docker's units); swap is limited to the same, so no swap is added"""
    pids: int = 1024
    """most processes and threads at once: a fork bomb stops there"""
    network: bool = False
    """False: the container has only a loopback interface"""
    cpus: float | None = None
    """CPU cores the container may use (None: no limit)"""

    def run_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the docker SDK's ``containers.run``/``create``."""
        kwargs: dict[str, Any] = {
            "network_mode": "bridge" if self.network else "none",
            "mem_limit": self.memory, "memswap_limit": self.memory, "pids_limit": self.pids,
            "security_opt": ["no-new-privileges"],
        }
        if self.cpus is not None:
            kwargs["nano_cpus"] = int(self.cpus * 1e9)
        return kwargs


# Every container a DockerSandbox starts carries SANDBOX_LABEL and the owner label (host, pid,
# process start time), so a later run can find the containers of a process killed with -9 and
# remove them, and leave alone those of processes still running (here or on another host).
SANDBOX_LABEL = "crl-gym.sandbox"
_OWNER_LABEL = "crl-gym.owner"
_swept_stale = threading.Event()


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``None``: no such process):
    with the pid, it names a process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def _owner_gone(owner: str) -> bool:
    """Whether the process that started a container has ended (only said of this host's)."""
    host, _, rest = owner.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return _process_start(int(pid)) != start


def sandbox_labels() -> dict[str, str]:
    """The labels of this process's sandbox containers."""
    return {SANDBOX_LABEL: "1", _OWNER_LABEL: _owner()}


def remove_stale_containers(client: Any) -> list[str]:
    """Remove the sandbox containers whose process has ended without removing them (killed
    with -9, say); returns their names. Containers of running processes are kept."""
    removed = []
    try:
        containers = client.containers.list(all=True, filters={"label": SANDBOX_LABEL})
    except Exception:  # the daemon went away, or a client double without listing
        return removed
    for container in containers:
        if _owner_gone(container.labels.get(_OWNER_LABEL, "")):
            try:
                container.remove(force=True)
                removed.append(container.name)
            except Exception:  # removed meanwhile by another run
                pass
    return removed


class _HardenedContainers:
    """``client.containers`` as swebench's ``run_instance`` sees it: the grading container it
    creates gets the sandbox's limits and labels instead of the extra capability swebench adds
    (``SYS_ADMIN``), and the sandbox's init, which ends on SIGTERM, so swebench's
    ``docker stop`` returns at once instead of after its 15 s grace period."""

    def __init__(self, containers: Any, limits: ContainerLimits) -> None:
        self._containers, self._limits = containers, limits

    def create(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("cap_add", None)
        kwargs.update(self._limits.run_kwargs(), labels=sandbox_labels(), command=_CONTAINER_INIT)
        return self._containers.create(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._containers, name)


class _HardenedClient:
    """A docker client whose new containers are hardened (``_HardenedContainers``)."""

    def __init__(self, client: Any, limits: ContainerLimits) -> None:
        self.client, self.containers = client, _HardenedContainers(client.containers, limits)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


# The container's init (see DockerSandbox.__init__): bash, which reaps every orphan (so no
# zombie keeps a process slot, or looks alive to `kill -0`), ends on SIGTERM (so `docker stop`
# returns at once) and starts its `tail` again when a kill took it. Its last argument marks
# it as ours: the kill below checks it first, so that it can never act outside our container.
_INIT_MARK = "crl-sandbox-init"
_CONTAINER_INIT = ["bash", "-c", "trap 'exit 0' TERM; while :; do tail -f /dev/null & wait $!; done",
                   _INIT_MARK]
# Ends every process of the container but its init (the kill's own shell is spared by -1).
_KILL_ALL_BUT_INIT = ["bash", "-c", "[ \"$(tr '\\0' '\\n' < /proc/1/cmdline | tail -n 1)\" = "
                      f"{_INIT_MARK} ] && kill -KILL -1"]
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


def ensure_image(client: Any, image: str, instance_id: str) -> None:
    """``image`` is local, or pulled; else ``SandboxError`` saying how to get it. Images of
    the ``crl-gym/`` namespace are built here, offline, never pulled."""
    try:
        client.images.get(image)
        return
    except Exception as missing:
        if image.startswith("crl-gym/"):
            raise SandboxError(
                f"Docker image {image} for {instance_id} is not on this machine; it is built "
                "offline: run `crl swe build-image toy` (as root; README, SWE-bench with Docker)."
            ) from missing
    try:
        client.images.pull(image)
    except Exception as err:
        raise SandboxError(
            f"Docker image {image} for {instance_id} is not on this machine and could not be "
            f"pulled ({err}). With network: `docker pull {image}`, or build it with "
            f"`python -m swebench.harness.prepare_images --instance_ids {instance_id}`."
        ) from err


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
