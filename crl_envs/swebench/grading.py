"""Grading an SWE task the way SWE-bench does: swebench's test spec, log parsers and report.

Holds:
- ``Grade``: the outcome of grading one patch (resolved, FAIL_TO_PASS / PASS_TO_PASS pass
  fractions, swebench's report).
- ``grade_log``: swebench's ``get_eval_report`` over a test log, with the row's
  ``make_test_spec`` (log parser, expected tests); no Docker needed.
- ``grade_patch``: run the sandbox's evaluation of a patch, then ``grade_log``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crl_envs.swebench.sandbox import Sandbox

__all__ = ["Grade", "grade_log", "grade_patch"]


@dataclass
class Grade:
    """What swebench's report says about one patch.

    ``fail_to_pass`` and ``pass_to_pass`` are the fractions of those tests that passed (0 when
    the patch did not apply or the tests did not run); ``report`` is swebench's per-instance
    report, test lists included.
    """

    resolved: bool
    applied: bool
    fail_to_pass: float
    pass_to_pass: float
    report: dict[str, Any] = field(default_factory=dict)


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
                timeout: float = 1800, log_dir: Path | None = None) -> Grade:
    """Evaluate ``patch`` in ``sandbox`` (fresh copy of the base commit) and grade the log.

    An empty patch is graded unresolved without running anything, as SWE-bench's apply step
    would fail on it.
    """
    if not patch.strip():
        return grade_log(instance, "", None)
    if log_dir is None:
        with tempfile.TemporaryDirectory(prefix="crl-swe-eval-") as tmp:
            return grade_log(instance, patch,
                             sandbox.evaluate(instance, patch, Path(tmp), timeout))
    return grade_log(instance, patch, sandbox.evaluate(instance, patch, log_dir, timeout))
