"""Field factories of the training configuration's schema: what values a setting may take,
declared beside its default (``schema``), checked after loading (``validation``).

Holds:
- ``choice``: a ``str`` field that takes one of a set of values (fixed, or a table's names when
  the config is checked);
- ``bounded``: a numeric field with lower and/or upper bounds, and ``Bounds``, what it declares
  (its range in words, and the message naming a value outside it);
- ``setting_problem`` (and its parts) and ``check_settings``: a value against what its field
  declares, the one check of a setting, whether it comes from a loaded config or is handed to a
  runtime object (``RetrievalConfig``, ``RolloutConfig``) by code.

>>> from dataclasses import dataclass, fields
>>> @dataclass
... class Sampling:
...     top_p: float = bounded(1.0, gt=0, le=1, why="1: no nucleus cut")
>>> bounds = fields(Sampling)[0].metadata["bounds"]
>>> bounds.problem(1.0) is None, bounds.problem(1.5)
(True, 'must be in (0, 1] (1: no nucleus cut), got 1.5')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from typing import Any

__all__ = ["choice", "bounded", "Bounds", "finite_problem", "choice_problem", "bounds_problem",
           "setting_problem", "check_settings"]


def choice(*values: str, among: Callable[[], Sequence[str]] | None = None) -> Any:
    """A ``str`` field that takes one of ``values`` (the first is the default), checked after
    loading; with ``among``, one of what ``among()`` returns when it is checked (a table that
    code may grow, e.g. the sampling engines, read then, not at import). Not ``Literal``:
    OmegaConf 2.3, the one Hydra 1.3 requires, cannot read it.

    >>> table = ["hf"]
    >>> engine = choice("auto", among=lambda: ["auto", *table])
    >>> table.append("echo")
    >>> engine.default, choice_problem(engine, "echo"), choice_problem(engine, "tgi")
    ('auto', None, "invalid value 'tgi', expected one of auto, hf, echo")
    """
    return field(default=values[0], metadata={"choices": among or values})


Number = int | float


@dataclass(frozen=True)
class Bounds:
    """The values a numeric field may take: at least ``ge`` (or above ``gt``), at most ``le``
    (or below ``lt``); ``why`` notes what a bound value means (e.g. ``0: every layer``). A field
    that may be null is checked only when it is not.

    >>> Bounds(ge=0, why="0: every layer").problem(-1)
    'must be >= 0 (0: every layer), got -1'
    >>> str(Bounds(ge=0, lt=1)), Bounds(gt=0).problem(None)
    ('in [0, 1)', None)
    """

    ge: Number | None = None
    gt: Number | None = None
    le: Number | None = None
    lt: Number | None = None
    why: str = ""

    def __post_init__(self) -> None:
        if self.ge is None and self.gt is None and self.le is None and self.lt is None:
            raise ValueError("Bounds needs at least one of ge, gt, le, lt")

    def __str__(self) -> str:
        low = f"[{self.ge}" if self.ge is not None else f"({self.gt}" if self.gt is not None else ""
        high = f"{self.le}]" if self.le is not None else f"{self.lt})" if self.lt is not None else ""
        if low and high:
            return f"in {low}, {high}"
        ops = ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
        return next(f"{op} {bound}" for op, bound in ops if bound is not None)

    def admits(self, value: Number) -> bool:
        """Whether ``value`` lies within the bounds."""
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def problem(self, value: Number | None) -> str | None:
        """What is wrong with ``value`` (``must be ..., got ...``), or None when it is within
        the bounds or null."""
        if value is None or self.admits(value):
            return None
        note = f" ({self.why})" if self.why else ""
        return f"must be {self}{note}, got {value}"


def bounded(default: Number | None, *, ge: Number | None = None, gt: Number | None = None,
            le: Number | None = None, lt: Number | None = None, why: str = "") -> Any:
    """A numeric field with ``default`` and ``Bounds(ge, gt, le, lt, why)``, checked after
    loading; a ``None`` default (or value) means null is allowed."""
    return field(default=default, metadata={"bounds": Bounds(ge, gt, le, lt, why)})


def finite_problem(value: Any) -> str | None:
    """NaN or infinity, which pass every bound's comparison, named; else None."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number, got nan or inf"
    return None


def choice_problem(declared: Field, value: Any) -> str | None:
    """A value outside the field's ``choice``, named; else None."""
    choices = declared.metadata.get("choices")
    if callable(choices):
        choices = choices()
    if choices is not None and value not in choices:
        shown = value[:40] if isinstance(value, str) else value  # a line, whatever was given
        return f"invalid value {shown!r}, expected one of {', '.join(choices)}"
    return None


def bounds_problem(declared: Field, value: Any) -> str | None:
    """A value outside the field's ``bounded`` range, named; else None."""
    return declared.metadata["bounds"].problem(value) if "bounds" in declared.metadata else None


def setting_problem(declared: Field, value: Any) -> str | None:
    """What is wrong with ``value`` for the field ``declared``: not finite, not a choice, out of
    bounds; None when nothing is."""
    return finite_problem(value) or choice_problem(declared, value) \
        or bounds_problem(declared, value)


def check_settings(section: type, prefix: str, values: Mapping[str, Any]) -> None:
    """Check ``values`` (setting name -> value) against what ``section``'s fields declare; the
    first bad one raises ``ValueError`` naming its config key (``prefix.name``).

    >>> @dataclass
    ... class Sampling:
    ...     top_p: float = bounded(1.0, gt=0, le=1)
    >>> check_settings(Sampling, "actor", {"top_p": 2.0})
    Traceback (most recent call last):
    ValueError: bad setting 'actor.top_p': must be in (0, 1], got 2.0
    """
    declared = {f.name: f for f in fields(section)}
    for name, value in values.items():
        problem = setting_problem(declared[name], value)
        if problem is not None:
            raise ValueError(f"bad setting '{prefix}.{name}': {problem}")
