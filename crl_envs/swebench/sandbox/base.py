"""The interface of a sandbox and what every sandbox shares.

Holds:
- ``CommandResult``: what one shell command produced (bounded output, exit code, timeout flag).
- ``Sandbox``: the interface the tools and the env use (shell, files, diff, grading run).
- ``cut_output``; the limits ``OUTPUT_LIMIT`` and ``MAX_PATCH_BYTES``; ``CONTAINER_REPO``.
- ``SandboxError``, ``PathOutsideSandboxError``, ``FileTooLargeError``,
  ``UnisolatedSandboxWarning``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crl_envs.errors import UserFacingError

__all__ = [
    "CommandResult",
    "Sandbox",
    "SandboxError",
    "PathOutsideSandboxError",
    "FileTooLargeError",
    "UnisolatedSandboxWarning",
    "OUTPUT_LIMIT",
    "MAX_PATCH_BYTES",
    "CONTAINER_REPO",
    "cut_output",
]

# SWE-agent's observation cap: longer tool output is cut, with a marker saying so.
OUTPUT_LIMIT = 16_000
# Bytes kept from a command's output stream before the rest is only counted (memory bound).
_READ_CAP = 4 * OUTPUT_LIMIT

# The eval scripts of SWE-bench put the repository here; observations name it.
CONTAINER_REPO = "/testbed"

# The largest submission that is graded (bytes). SWE-bench's gold patches are a few KB; a diff
# of megabytes is a generated or vendored file, and applying and grading it costs the host.
MAX_PATCH_BYTES = 1_000_000


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
