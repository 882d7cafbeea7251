"""Grading an SWE task the way SWE-bench does: swebench's test spec, log parsers and report.

Holds:
- ``Grade``: the outcome of grading one patch (resolved, FAIL_TO_PASS / PASS_TO_PASS pass
  fractions, swebench's report, what was left out of the grading and why).
- ``grade_log``: swebench's ``get_eval_report`` over a test log, with the row's
  ``make_test_spec`` (log parser, expected tests); no Docker needed.
- ``grade_patch``: run the sandbox's evaluation of a patch, then ``grade_log``.
- ``filter_patch``, ``protected_reason``: the hardened grading's patch filter.
- ``GRADINGS``, ``MAX_PATCH_BYTES``.

Two gradings. ``"hardened"`` (the default) grades the patch without its changes to test files,
test configuration and interpreter start-up hooks (``conftest.py``, ``pytest.ini``,
``setup.cfg``, ``tox.ini``, ``pyproject.toml``, ``sitecustomize.py``, ``*.pth``, test
directories, modules shadowing pytest) and without new symlinks: a policy that writes a pytest
hook reporting every test passed would otherwise be rewarded. ``"swebench"`` applies the patch
whole, as upstream's harness does, for numbers comparable with the leaderboard. Both refuse a
patch over ``MAX_PATCH_BYTES`` without applying it.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from crl_envs.swebench.sandbox import MAX_PATCH_BYTES

if TYPE_CHECKING:
    from crl_envs.swebench.sandbox import Sandbox

__all__ = ["GRADINGS", "MAX_PATCH_BYTES", "Grade", "filter_patch", "grade_log", "grade_patch",
           "protected_reason"]

GRADINGS = ("hardened", "swebench")


@dataclass
class Grade:
    """What swebench's report says about one patch.

    ``fail_to_pass`` and ``pass_to_pass`` are the fractions of those tests that passed (0 when
    the patch did not apply or the tests did not run); ``report`` is swebench's per-instance
    report, test lists included. ``patch`` is what was graded, ``dropped_paths`` the files
    whose changes the hardened grading left out, ``note`` says what was left out and why.
    """

    resolved: bool
    applied: bool
    fail_to_pass: float
    pass_to_pass: float
    report: dict[str, Any] = field(default_factory=dict)
    patch: str = ""
    dropped_paths: list[str] = field(default_factory=list)
    note: str = ""


# ----------------------------------------------------------------------------- patch filter
_TEST_DIRS = frozenset({"test", "tests", "testing"})
# Files pytest or the interpreter read before or while collecting tests.
_TEST_CONFIG = frozenset({"conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg",
                          "pyproject.toml", "sitecustomize.py", "usercustomize.py"})
# Top-level modules that would shadow the test runner (`python -m pytest` puts the repository
# first on sys.path).
_RUNNER_MODULES = frozenset({"pytest", "_pytest", "py", "pluggy", "iniconfig", "unittest",
                             "nose", "sitecustomize", "usercustomize"})


def protected_reason(path: str) -> str | None:
    """Why the hardened grading leaves out changes to ``path`` (relative), or ``None``.

    >>> protected_reason("pkg/tests/conftest.py"), protected_reason("pkg/core.py")
    ('test configuration', None)
    """
    parts = PurePosixPath(path).parts
    if not parts:
        return None
    name = parts[-1]
    if name in _TEST_CONFIG or name.endswith(".pth"):
        return "test configuration"
    if any(part in _TEST_DIRS for part in parts[:-1]) or name == "tests.py" or (
            name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))):
        return "test file"
    top = parts[0][:-3] if len(parts) == 1 and parts[0].endswith(".py") else parts[0]
    if top in _RUNNER_MODULES and (len(parts) > 1 or parts[0].endswith(".py")):
        return "shadows the test runner"
    return None


_HUNK = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_BINARY_BLOCK = re.compile(r"(literal|delta) \d+\n?$")
_GIT_HEADERS = ("old mode ", "new mode ", "deleted file mode ", "new file mode ", "copy from ",
                "copy to ", "rename from ", "rename to ", "similarity index ",
                "dissimilarity index ", "index ", "Binary files ")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(name: str) -> str:
    """A path as git writes it in a patch: C-quoted (``"a/t\\303\\251"``) when unusual."""
    name = name.rstrip("\n")
    if not name.startswith('"'):
        return name.split("\t", 1)[0]  # traditional diffs add a tab and a timestamp
    out, at = bytearray(), 1
    while at < len(name) and name[at] != '"':
        char = name[at]
        if char == "\\" and at + 1 < len(name):
            following = name[at + 1]
            if following in "01234567":
                out.append(int(name[at + 1:at + 4], 8) & 0xFF)
                at += 4
                continue
            out.append(_ESCAPES.get(following, ord(following) & 0xFF))
            at += 2
            continue
        out += char.encode("utf-8", "surrogateescape")
        at += 1
    return out.decode("utf-8", "surrogateescape")


def _strip_prefix(name: str) -> str | None:
    name = _unquote(name)
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name


def _header_paths(line: str) -> list[str]:
    """The two paths of ``diff --git a/X b/Y`` (both candidates when spaces make it ambiguous)."""
    rest = line[len("diff --git "):].rstrip("\n")
    if rest.startswith('"'):
        end = rest.find('" ', 1)
        return [p for p in (_strip_prefix(rest[:end + 1]), _strip_prefix(rest[end + 2:])) if p]
    half = (len(rest) - 1) // 2
    if rest[2:half] == rest[half + 3:]:
        return [rest[2:half]]
    return [p for p in (_strip_prefix(part) for part in rest.split(" b/", 1)) if p]


class _Section:
    """One file's part of a patch: the paths it names and the lines that are kept of it."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.lines: list[str] = []
        self.git = False
        self.has_file_header = False
        self.has_hunk = False
        self.symlink = False


def _sections(patch: str) -> list[_Section]:
    """Split ``patch`` into per-file sections, reading hunks by their line counts (as git apply
    and patch do), so a file header hidden after a hunk starts a section of its own. Lines that
    are none of a diff's parts are dropped: what is kept is exactly what is attributed."""
    lines = patch.splitlines(keepends=True)
    sections: list[_Section] = []
    current: _Section | None = None
    at = 0
    while at < len(lines):
        line = lines[at]
        if line.startswith("diff --git "):
            current = _Section()
            current.git, current.paths = True, _header_paths(line)
            current.lines.append(line)
            sections.append(current)
        elif line.startswith("--- ") and at + 1 < len(lines) and lines[at + 1].startswith("+++ "):
            if current is None or current.has_file_header or current.has_hunk or not current.git:
                current = _Section()
                sections.append(current)
            current.has_file_header = True
            current.paths += [p for p in (_strip_prefix(line[4:]),
                                          _strip_prefix(lines[at + 1][4:])) if p]
            current.lines += [line, lines[at + 1]]
            at += 1
        elif (match := _HUNK.match(line)) and current is not None and current.has_file_header:
            current.has_hunk = True
            current.lines.append(line)
            old = int(match.group(1)) if match.group(1) is not None else 1
            new = int(match.group(2)) if match.group(2) is not None else 1
            while at + 1 < len(lines) and (old > 0 or new > 0 or lines[at + 1].startswith("\\")):
                body = lines[at + 1]
                kind = body[:1]
                if kind in (" ", "\n"):
                    old, new = old - 1, new - 1
                elif kind == "-":
                    old -= 1
                elif kind == "+":
                    new -= 1
                elif kind != "\\":
                    break
                current.lines.append(body)
                at += 1
        elif current is not None and current.git and not current.has_hunk and (
                line.startswith(_GIT_HEADERS)):
            current.lines.append(line)
            if line.startswith(("rename ", "copy ")):
                current.paths.append(_unquote(line.split(" ", 2)[2]))
            current.symlink |= line.startswith(("new file mode 120000", "new mode 120000"))
        elif current is not None and current.git and line.startswith("GIT binary patch"):
            current.has_hunk = True
            current.lines.append(line)
            while at + 1 < len(lines) and _BINARY_BLOCK.match(lines[at + 1]):
                at += 1
                current.lines.append(lines[at])
                while at + 1 < len(lines) and lines[at + 1][:1].isalpha():
                    at += 1
                    current.lines.append(lines[at])
                if at + 1 < len(lines) and lines[at + 1].strip() == "":
                    at += 1
                    current.lines.append(lines[at])
        at += 1
    return sections


def filter_patch(patch: str, protected: set[str] | frozenset[str] = frozenset(),
                 allowed: set[str] | frozenset[str] = frozenset()) -> tuple[str, list[str]]:
    """``patch`` without the files the hardened grading leaves out; and those files, sorted.

    A file is left out when ``protected_reason`` names it and it is not in ``allowed`` (the
    files the task's reference fix changes), when it is in ``protected`` (the task's test
    files), or when the patch makes it a symlink. Only the parts of the patch that belong to a
    file diff are kept, so nothing can be smuggled past the filter.

    >>> patch = ("diff --git a/conftest.py b/conftest.py\\nnew file mode 100644\\n--- /dev/null\\n"
    ...          "+++ b/conftest.py\\n@@ -0,0 +1 @@\\n+import evil\\n")
    >>> filter_patch(patch)
    ('', ['conftest.py'])
    """
    kept, dropped = [], set()
    for section in _sections(patch):
        refused = [path for path in section.paths if section.symlink or path in protected
                   or (protected_reason(path) and path not in allowed)]
        if refused:
            dropped.update(refused)
        elif section.paths:
            kept.extend(section.lines)
    return "".join(kept), sorted(dropped)


def _patch_paths(patch: str | None) -> frozenset[str]:
    """The files a patch changes (of a task row: its ``test_patch`` or its gold ``patch``)."""
    return frozenset(path for section in _sections(patch or "") for path in section.paths)


def _fraction(lists: dict[str, list[str]]) -> float:
    total = len(lists["success"]) + len(lists["failure"])
    return len(lists["success"]) / total if total else 1.0


def grade_log(instance: dict[str, Any], patch: str | None, log_path: Path | None) -> Grade:
    """Grade ``patch`` from the eval script's output at ``log_path`` with swebench's report.

    ``log_path=None`` means the patch did not apply (nothing ran).
    """
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS
    from swebench.harness.grading import get_eval_report
    from swebench.harness.utils import make_test_spec

    instance_id = instance["instance_id"]
    if not patch or log_path is None:
        report = {"patch_is_None": patch is None, "patch_exists": bool(patch),
                  "patch_successfully_applied": False, "resolved": False}
        return Grade(False, False, 0.0, 0.0, report)
    prediction = {"instance_id": instance_id, "model_patch": patch, "model_name_or_path": "crl"}
    report = get_eval_report(make_test_spec(instance), prediction, str(log_path),
                             include_tests_status=True)[instance_id]
    status = report.get("tests_status")
    if not status:
        return Grade(False, bool(report["patch_successfully_applied"]), 0.0, 0.0, report)
    return Grade(bool(report["resolved"]), True, _fraction(status[FAIL_TO_PASS]),
                 _fraction(status[PASS_TO_PASS]), report)


def grade_patch(sandbox: Sandbox, instance: dict[str, Any], patch: str,
                timeout: float = 1800, log_dir: Path | None = None,
                grading: str = "hardened") -> Grade:
    """Evaluate ``patch`` in ``sandbox`` (fresh copy of the base commit) and grade the log.

    ``grading``: ``"hardened"`` leaves out changes to test files and test configuration
    (``filter_patch``; the grade names them), ``"swebench"`` grades the patch whole, as
    upstream does. A patch over ``MAX_PATCH_BYTES`` is graded unresolved without being
    applied, and so is an empty one, as SWE-bench's apply step would fail on it.
    """
    if grading not in GRADINGS:
        raise ValueError(f"grading={grading!r} is not one of {GRADINGS}.")
    size = len(patch.encode("utf-8", "surrogateescape"))
    if size > MAX_PATCH_BYTES:
        grade = grade_log(instance, patch, None)
        grade.patch = patch[:MAX_PATCH_BYTES]
        grade.note = (f"The patch is over {MAX_PATCH_BYTES:,} bytes, too large to apply and "
                      "grade; it was graded unresolved.")
        return grade
    dropped: list[str] = []
    if grading == "hardened":
        # The hidden tests' files are never the agent's; a file the reference fix changes
        # (setup.cfg in one task of SWE-bench Verified) is part of the task.
        patch, dropped = filter_patch(patch, protected=_patch_paths(instance.get("test_patch")),
                                      allowed=_patch_paths(instance.get("patch")))
    if not patch.strip():
        grade = grade_log(instance, "", None)
    elif log_dir is None:
        with tempfile.TemporaryDirectory(prefix="crl-swe-eval-") as tmp:
            grade = grade_log(instance, patch,
                              sandbox.evaluate(instance, patch, Path(tmp), timeout))
    else:
        grade = grade_log(instance, patch, sandbox.evaluate(instance, patch, log_dir, timeout))
    grade.patch, grade.dropped_paths = patch, dropped
    if dropped:
        grade.note = ("Changes to test files and test configuration were not graded: "
                      f"{', '.join(dropped)}.")
    return grade
