"""``LocalSandbox``: a temporary git checkout on this host (opt-in: commands run unisolated).

Holds ``LocalSandbox``, its once-a-process ``UnisolatedSandboxWarning`` (``_warn_unisolated``)
and the variables its commands inherit (``_PASSED_ENV``). Its commands run under the reaper
(``supervised``, ``reaper``); it reads and writes files without following symlinks.

``LocalSandbox`` is no security boundary (docs/threat-model.md): it only keeps an honest agent
from harming the host by accident and keeps the grading and the tools from being subverted
through files of the checkout (git configuration, symlinks, oversized files).
"""

from __future__ import annotations

import functools
import os
import selectors
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
import weakref
from pathlib import Path
from typing import Any

from crl_envs.swebench.sandbox.base import (
    _READ_CAP,
    CONTAINER_REPO,
    MAX_PATCH_BYTES,
    CommandResult,
    SandboxError,
    UnisolatedSandboxWarning,
    cut_output,
)
from crl_envs.swebench.sandbox.files import _CheckoutFiles
from crl_envs.swebench.sandbox.git import (
    _APPLY_COMMANDS,
    _DIFF_ARGS,
    _GIT_GUARDS,
    _GIT_TIMEOUT,
    _git_env,
    _run_capped,
    _run_git,
    init_repo_from_files,
)
from crl_envs.swebench.sandbox.shell import _SHELL_WRAPPER, _STATE_END, _STATE_LIMIT
from crl_envs.swebench.sandbox.supervised import _drain, _read_available, _Supervised

__all__ = ["LocalSandbox"]

# The largest file (the test log included) a LocalSandbox grading run may write, in KiB.
_EVAL_FILE_LIMIT_KB = 200 * 1024

# The variables of this process a LocalSandbox's commands inherit (plus its own and `env=`).
_PASSED_ENV = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "TZ",
                         "TMPDIR"})


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


def _remove_local(commands: set[_Supervised], checkout: Path, root: Path) -> None:
    for command in list(commands):
        command.stop()
    commands.clear()
    shutil.rmtree(checkout, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)


class LocalSandbox(_CheckoutFiles):
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
