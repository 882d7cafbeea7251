"""Git as the sandboxes run it: never under the agent's configuration.

Holds ``init_repo_from_files`` (a directory of files as one deterministic commit) and the
plumbing of the sandboxes: the command-line guards against the repository's own configuration
(``_GIT_GUARDS``, ``_DIFF_ARGS``), the environment of every git run (``_git_env``),
``_run_git``, ``_run_capped`` (a run whose output is bounded) and swebench's patch-application
fallbacks (``_APPLY_COMMANDS``).
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from crl_envs.swebench.sandbox.base import SandboxError

__all__ = ["init_repo_from_files"]

# Configuration the agent could have set in the repository's .git/config and that makes git run
# its commands or wait on them; the command line wins over every config file. (External diff
# drivers and textconv filters are switched off by _DIFF_ARGS.)
_GIT_GUARDS = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
               "-c", "core.untrackedCache=false", "-c", "core.pager=cat")
# Against the base commit, not HEAD: changes the agent has committed are part of its answer.
_DIFF_ARGS = ("-c", "core.fileMode=false", "diff", "--cached", "--no-color", "--no-ext-diff",
              "--no-textconv")
_GIT_TIMEOUT = 120.0

# swebench's patch-application fallbacks (harness.run_evaluation.GIT_APPLY_CMDS), in order, less
# `git apply --reject`, which leaves a half-applied tree behind.
_APPLY_COMMANDS = (
    ["git", "apply", "--verbose"],
    ["git", "apply", "--verbose", "--3way"],
    ["patch", "--batch", "--forward", "--fuzz=5", "-p1", "-i"],
)


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
