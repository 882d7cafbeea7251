"""What ``efficacy.py --reuse`` checks in a finished run folder before it reads it.

Holds ``reused_run_problem``: why a run folder's ``heldout.json`` and ``metrics.jsonl`` cannot be
read as a finished run of this invocation (files emptied, edited or from another
``--eval-levels``), in one line, or None. ``efficacy.py`` runs it on every reused folder before
the warm start is evaluated, so a tampered folder stops the script at once with that line
instead of a traceback after minutes of evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["reused_run_problem"]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def reused_run_problem(run_dir: Path, levels: int) -> str | None:
    """Why ``run_dir`` is not a finished run whose ``heldout.json`` holds one outcome (true or
    false) for each of ``levels`` held-out levels (from its config's ``tasks.heldout_offset``)
    and whose ``metrics.jsonl`` holds at least one step of numeric metrics; None when it is.

    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "config.json").write_text('{"tasks": {"heldout_offset": 7}}')
    >>> _ = (run / "heldout.json").write_text('{"outcomes": {"7": true, "8": false}}')
    >>> _ = (run / "metrics.jsonl").write_text('{"step": 1, "success/all": 0.5}\\n')
    >>> reused_run_problem(run, 2) is None
    True
    >>> reused_run_problem(run, 3).split(": ", 1)[1]
    'heldout.json holds 2 held-out levels, not the 3 of --eval-levels; rerun with --eval-levels 2 or move the folder away to train it again'
    """
    from crl_harness.training.metrics import read_metrics

    again = "move the folder away to train it again"
    try:
        offset = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["tasks"][
            "heldout_offset"]
        heldout = json.loads((run_dir / "heldout.json").read_text(encoding="utf-8"))
        records = read_metrics(run_dir / "metrics.jsonl")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        return f"{run_dir}: its config.json, heldout.json or metrics.jsonl cannot be read " \
               f"({type(err).__name__}: {str(err)[:200]}); {again}"
    outcomes = heldout.get("outcomes") if isinstance(heldout, dict) else None
    if not isinstance(outcomes, dict) or not all(isinstance(v, bool) for v in outcomes.values()):
        return f"{run_dir}: heldout.json is not {{\"outcomes\": {{LEVEL: true or false}}}}; {again}"
    wanted = {str(level) for level in range(offset, offset + levels)}
    if set(outcomes) != wanted:
        if all(key.isdigit() and int(key) - offset in range(len(outcomes)) for key in outcomes):
            return (f"{run_dir}: heldout.json holds {len(outcomes)} held-out levels, not the "
                    f"{levels} of --eval-levels; rerun with --eval-levels {len(outcomes)} or "
                    f"{again}")
        return f"{run_dir}: heldout.json's levels are not the held-out levels " \
               f"{offset}..{offset + levels - 1}; {again}"
    banked = heldout.get("outcomes_with_bank")  # an experience arm's, the same levels or none
    if banked is not None and (not isinstance(banked, dict) or set(banked) != wanted
                               or not all(isinstance(v, bool) for v in banked.values())):
        return f"{run_dir}: heldout.json's outcomes_with_bank are not one true or false for each " \
               f"of its held-out levels; {again}"
    handed = heldout.get("handed_lessons")  # of the levels with the bank: wins replayed
    if handed is not None and (not isinstance(handed, dict) or not set(handed) <= wanted
                               or not all(isinstance(v, bool) for v in handed.values())):
        return f"{run_dir}: heldout.json's handed_lessons are not true or false for some of " \
               f"its held-out levels; {again}"
    if not records:
        return f"{run_dir}: metrics.jsonl holds no step; {again}"
    for number, record in enumerate(records, start=1):
        bad = next((key for key, value in record.items() if not _is_number(value)), None) \
            if isinstance(record, dict) else "(the record)"
        if bad is not None:
            return f"{run_dir}: metrics.jsonl record {number}: {str(bad)[:80]} is not a " \
                   f"number; {again}"
        missing = next((key for key, n in record.items() if key.startswith("episodes/") and n
                        and f"success/{key.removeprefix('episodes/')}" not in record), None)
        if missing is not None:
            return f"{run_dir}: metrics.jsonl record {number} has {missing[:80]} but no " \
                   f"success rate for it; {again}"
    return None
