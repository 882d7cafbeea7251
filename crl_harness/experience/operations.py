"""The extractor's operations on the bank, and the strict parser of its answers.

Holds:
- Distillation operations (at most 3 an answer): ``Add``, ``Update`` (the paper's refine: the
  referenced entries are replaced by the merged one), ``Vote`` (up or down); ``return`` is the
  empty list.
- Merge-pass operations: ``Merge``, ``Rewrite``, ``Discard``; ``return`` is the empty list.
- ``ParseLimits`` and ``ParseResult``; ``parse_distillation`` and ``parse_merge``.

The extractor answers with a JSON list inside the last ``<answer>...</answer>``, e.g.
``[{"op": "add", "title": "...", "content": "..."}, {"op": "update", "target_idx": [0, 1],
"title": "...", "content": "..."}, {"op": "upvote", "target_idx": 2}]``. Indices refer to the
numbered entries shown in the prompt. The parser is strict and bounded: ``json.loads`` on at most
``max_answer_chars`` characters (never ``eval``), every field checked, and any error rejects the
whole answer, so a malformed answer applies nothing and comes back as ``ParseResult.error``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from crl_harness.prompting import last_answer_block

__all__ = [
    "Add", "Update", "Vote", "Merge", "Rewrite", "Discard", "Operation",
    "ParseLimits", "ParseResult", "parse_distillation", "parse_merge", "extract_answer",
]


@dataclass(frozen=True)
class Add:
    """Write a new entry."""

    title: str
    content: str


@dataclass(frozen=True)
class Update:
    """Replace the shown entries ``targets`` by one merged entry."""

    targets: tuple[int, ...]
    title: str
    content: str


@dataclass(frozen=True)
class Vote:
    """+1 (upvote) or -1 (downvote) on a shown entry; negative votes delete it."""

    target: int
    delta: int


@dataclass(frozen=True)
class Merge:
    """Merge pass: replace ``targets`` (two or more) by one entry."""

    targets: tuple[int, ...]
    title: str
    content: str


@dataclass(frozen=True)
class Rewrite:
    """Merge pass: replace one entry by a better-worded one."""

    target: int
    title: str
    content: str


@dataclass(frozen=True)
class Discard:
    """Merge pass: delete a wrong or redundant entry."""

    target: int


Operation = Add | Update | Vote | Merge | Rewrite | Discard


@dataclass(frozen=True)
class ParseLimits:
    """Bounds on what an extractor answer may contain."""

    max_answer_chars: int = 16_000
    """Characters between ``<answer>`` and ``</answer>``."""
    max_ops: int = 3
    """Operations in one distillation answer (a merge answer may touch every shown entry)."""
    max_title_chars: int = 120
    max_content_chars: int = 1_200


@dataclass(frozen=True)
class ParseResult:
    """The operations of a well-formed answer, or the reason it was rejected.

    Example:
        >>> parse_distillation('<answer>[{"op": "add", "title": "Keys", '
        ...                    '"content": "Pick up the key first."}]</answer>', n_shown=0)
        ParseResult(ops=(Add(title='Keys', content='Pick up the key first.'),), error=None)
        >>> parse_distillation("<answer>[{'op': 'add'}]</answer>", n_shown=0).ok
        False
    """

    ops: tuple[Operation, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class _Reject(ValueError):
    pass


def extract_answer(text: str, max_chars: int) -> str:
    """The body of the last ``<answer>...</answer>`` (code fences removed); raises ``_Reject``."""
    body = last_answer_block(text)
    if body is None:
        raise _Reject("no <answer>...</answer> block")
    body = body.strip()
    if len(body) > max_chars:
        raise _Reject(f"answer longer than {max_chars} characters")
    if body.startswith("```"):
        body = body.strip("`").strip()
        if body[:4].lower() == "json":
            body = body[4:]
    return body


def _load_list(text: Any, limits: ParseLimits) -> list[dict]:
    if not isinstance(text, str):
        raise _Reject(f"the extractor answered with {type(text).__name__}, not text")
    body = extract_answer(text, limits.max_answer_chars)
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise _Reject(f"answer is not JSON ({type(err).__name__})") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise _Reject("answer must be a JSON list of operations")
    if not all(isinstance(item, dict) for item in value):
        raise _Reject("every operation must be a JSON object")
    if any(item.get("op") == "return" for item in value):
        if len(value) != 1:
            raise _Reject("'return' must be the only operation")
        return []
    return value


def _text(item: dict, key: str, limit: int) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _Reject(f"'{key}' must be a non-empty string")
    value = value.strip()
    if len(value) > limit:
        raise _Reject(f"'{key}' longer than {limit} characters")
    return value


def _index(value: Any, n_shown: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Reject("'target_idx' must be an integer")
    if not 0 <= value < n_shown:
        raise _Reject(f"'target_idx' {value} out of range (0..{n_shown - 1})")
    return value


def _indices(value: Any, n_shown: int, minimum: int) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if len(values) > n_shown:
        raise _Reject("more targets than entries shown")
    targets = tuple(_index(v, n_shown) for v in values)
    if len(set(targets)) != len(targets) or len(targets) < minimum:
        raise _Reject(f"'target_idx' needs at least {minimum} distinct entries")
    return targets


def _targets_of(op: Operation) -> tuple[int, ...]:
    if isinstance(op, (Update, Merge)):
        return op.targets
    if isinstance(op, (Vote, Rewrite, Discard)):
        return (op.target,)
    return ()


def _check_disjoint(ops: list[Operation]) -> None:
    seen: set[int] = set()
    for op in ops:
        targets = set(_targets_of(op))
        if targets & seen:
            raise _Reject("two operations touch the same entry")
        seen |= targets


def parse_distillation(text: Any, n_shown: int, limits: ParseLimits = ParseLimits()) -> ParseResult:
    """Parse a distillation answer over ``n_shown`` retrieved entries; never raises."""
    try:
        items = _load_list(text, limits)
        if len(items) > limits.max_ops:
            raise _Reject(f"more than {limits.max_ops} operations")
        ops: list[Operation] = []
        for item in items:
            kind = item.get("op")
            if kind == "add":
                ops.append(Add(_text(item, "title", limits.max_title_chars),
                               _text(item, "content", limits.max_content_chars)))
            elif kind == "update":
                ops.append(Update(_indices(item.get("target_idx"), n_shown, 1),
                                  _text(item, "title", limits.max_title_chars),
                                  _text(item, "content", limits.max_content_chars)))
            elif kind in ("upvote", "downvote"):
                ops.append(Vote(_index(item.get("target_idx"), n_shown),
                                1 if kind == "upvote" else -1))
            else:
                raise _Reject(f"unknown operation {str(kind)[:40]!r} "
                              "(allowed: add, update, upvote, downvote, return)")
        _check_disjoint(ops)
        return ParseResult(tuple(ops))
    except _Reject as err:
        return ParseResult(error=str(err))


def parse_merge(text: Any, n_shown: int, limits: ParseLimits = ParseLimits()) -> ParseResult:
    """Parse a merge-pass answer over ``n_shown`` entries; never raises."""
    try:
        items = _load_list(text, limits)
        if len(items) > max(n_shown, 1):
            raise _Reject(f"more operations than the {n_shown} entries shown")
        ops: list[Operation] = []
        for item in items:
            kind = item.get("op")
            if kind == "merge":
                ops.append(Merge(_indices(item.get("target_idx"), n_shown, 2),
                                 _text(item, "title", limits.max_title_chars),
                                 _text(item, "content", limits.max_content_chars)))
            elif kind == "rewrite":
                ops.append(Rewrite(_index(item.get("target_idx"), n_shown),
                                   _text(item, "title", limits.max_title_chars),
                                   _text(item, "content", limits.max_content_chars)))
            elif kind == "discard":
                ops.append(Discard(_index(item.get("target_idx"), n_shown)))
            else:
                raise _Reject(f"unknown operation {str(kind)[:40]!r} "
                              "(allowed: merge, rewrite, discard, return)")
        _check_disjoint(ops)
        return ParseResult(tuple(ops))
    except _Reject as err:
        return ParseResult(error=str(err))
