"""A command run under the reaper (``reaper.py``), and the pipes it is read through.

Holds ``_Supervised`` (the reaper's process and the read ends of its status and shell-state
pipes), ``_read_available`` and ``_drain``. Used by ``LocalSandbox``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from crl_envs.swebench.sandbox import reaper

__all__: list[str] = []  # the local sandbox's own: every name here is private

# The reaper program, run by path (absolute: commands start in the checkout).
_REAPER_SCRIPT = os.path.abspath(reaper.__file__)


class _Supervised:
    """One command under the reaper (``reaper.py``): the reaper's process and the read ends of
    the status and shell-state pipes. Signals go only to the reaper while it is an unreaped
    child of ours, so its pid, and the process group it leads, cannot belong to anyone else."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], stdout: Any,
                 with_state: bool) -> None:
        status_r, status_w = os.pipe()
        state_r, state_w = os.pipe() if with_state else (-1, -1)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _REAPER_SCRIPT, str(status_w), str(state_w), *argv],
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
