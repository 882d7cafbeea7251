"""The strict parser of extractor answers: what it accepts, what it rejects, and a fuzz."""

from __future__ import annotations

import json
import random
import string

import pytest

from crl_harness.experience.operations import (
    Add,
    Discard,
    Merge,
    ParseLimits,
    Rewrite,
    Update,
    Vote,
    parse_distillation,
    parse_merge,
)


def answer(ops) -> str:
    return f"<think>the box got stuck</think>\n<answer>{json.dumps(ops)}</answer>"


def test_distillation_operations():
    text = answer([
        {"op": "add", "title": " Corners ", "content": "Never push a box into a corner."},
        {"op": "update", "target_idx": [0, 2], "title": "Walls", "content": "Walls trap boxes."},
        {"op": "downvote", "target_idx": 1},
    ])
    result = parse_distillation(text, n_shown=3)
    assert result.ok, result.error
    assert result.ops == (Add("Corners", "Never push a box into a corner."),
                          Update((0, 2), "Walls", "Walls trap boxes."), Vote(1, -1))
    assert parse_distillation(answer([{"op": "update", "target_idx": 1, "title": "t",
                                       "content": "c"}]), 2).ops == (Update((1,), "t", "c"),)
    assert parse_distillation(answer([{"op": "return"}]), 0).ops == ()
    fenced = '<answer>```json\n[{"op": "upvote", "target_idx": 0}]\n```</answer>'
    assert parse_distillation(fenced, 1).ops == (Vote(0, 1),)
    # The last answer block counts (a model may quote the format while thinking).
    two = '<think>e.g. <answer>[]</answer></think><answer>{"op": "add", "title": "a", "content": "b"}</answer>'
    assert parse_distillation(two, 0).ops == (Add("a", "b"),)


def test_merge_operations():
    text = answer([
        {"op": "merge", "target_idx": [0, 1], "title": "Keys", "content": "Keys open doors."},
        {"op": "rewrite", "target_idx": 2, "title": "Lava", "content": "Never step on lava."},
        {"op": "discard", "target_idx": 4},
    ])
    result = parse_merge(text, n_shown=5)
    assert result.ops == (Merge((0, 1), "Keys", "Keys open doors."),
                          Rewrite(2, "Lava", "Never step on lava."), Discard(4))


@pytest.mark.parametrize("text,n_shown,why", [
    ("no tags at all", 0, "no <answer>"),
    ("<answer>[{'op': 'add'}]</answer>", 0, "not JSON"),  # Python literal, never eval'ed
    ('<answer>[{"op": "add", "title": "t"}]</answer>', 0, "'content'"),
    ('<answer>[{"op": "add", "title": 5, "content": "c"}]</answer>', 0, "'title'"),
    ('<answer>[{"op": "add", "title": "  ", "content": "c"}]</answer>', 0, "'title'"),
    ('<answer>[{"op": "upvote", "target_idx": 3}]</answer>', 2, "out of range"),
    ('<answer>[{"op": "upvote", "target_idx": true}]</answer>', 2, "integer"),
    ('<answer>[{"op": "upvote", "target_idx": "0"}]</answer>', 2, "integer"),
    ('<answer>[{"op": "update", "target_idx": [0, 0], "title": "t", "content": "c"}]</answer>', 2,
     "distinct"),
    ('<answer>[{"op": "upvote", "target_idx": 0}, {"op": "downvote", "target_idx": 0}]</answer>',
     2, "same entry"),
    ('<answer>[{"op": "delete_everything"}]</answer>', 2, "unknown operation"),
    ('<answer>[{"op": "return"}, {"op": "add", "title": "t", "content": "c"}]</answer>', 0,
     "only operation"),
    ('<answer>"add"</answer>', 0, "JSON list"),
    ('<answer>[1, 2]</answer>', 0, "JSON object"),
    ("<answer>" + json.dumps([{"op": "add", "title": "t", "content": "c"}] * 4) + "</answer>", 0,
     "more than 3"),
    ("<answer>" + json.dumps([{"op": "add", "title": "t", "content": "c" * 5000}]) + "</answer>",
     0, "longer than"),
    ("<answer>" + "[" * 20_000 + "]" * 20_000 + "</answer>", 0, "longer than"),
])
def test_rejections_say_why(text, n_shown, why):
    result = parse_distillation(text, n_shown)
    assert not result.ok and result.ops == ()
    assert why in result.error


def test_merge_rejects_single_target_merge_and_overlap():
    assert "at least 2" in parse_merge(answer([{"op": "merge", "target_idx": [1], "title": "t",
                                                "content": "c"}]), 3).error
    assert "same entry" in parse_merge(answer([{"op": "discard", "target_idx": 1},
                                               {"op": "rewrite", "target_idx": 1, "title": "t",
                                                "content": "c"}]), 3).error


def _fuzz_cases(rng: random.Random):
    valid = answer([{"op": "add", "title": "Keys", "content": "Pick up the key first."},
                    {"op": "update", "target_idx": [0, 1], "title": "t", "content": "c"}])
    values = [None, True, 1, -1, 10**30, 1.5, float("nan"), "", "x", [], {}, [0, 1], {"a": 1},
              "0", [True], [-1], [99]]
    yield "x" * 10_000_000
    yield "<answer>" + "x" * 10_000_000 + "</answer>"
    yield "<answer>[" + '{"op": "add", "title": "t", "content": "c"},' * 300_000 + "]</answer>"
    yield "<answer>" + "[" * 5_000 + "</answer>"
    yield "<answer>" + '{"a":' * 3_000 + "1" + "}" * 3_000 + "</answer>"
    yield from (None, 42, b"<answer>[]</answer>", ["<answer>[]</answer>"], object())  # not text
    for _ in range(400):  # random text
        yield "".join(rng.choice(string.printable + "<>/{}[]\"'\u00e9\u4e2d\x00")
                      for _ in range(rng.randrange(0, 300)))
    for cut in range(0, len(valid), 3):  # truncated JSON
        yield valid[:cut]
        yield valid[:cut] + "</answer>"
    for _ in range(400):  # wrong types and shapes
        op = {"op": rng.choice(["add", "update", "upvote", "downvote", "return", "merge",
                                "rewrite", "discard", None, 3, ["add"]])}
        for key in ("title", "content", "target_idx"):
            if rng.random() < 0.8:
                op[key] = rng.choice(values)
        ops = [op] * rng.randrange(0, 8)
        body = json.dumps(ops) if rng.random() < 0.7 else json.dumps(op)
        yield f"<answer>{body}</answer>"
    for n in range(4, 50):  # too many ops
        yield answer([{"op": "add", "title": f"t{i}", "content": "c"} for i in range(n)])


def test_fuzz_never_raises():
    rng = random.Random(0)
    accepted = rejected = 0
    for case in _fuzz_cases(rng):
        for n_shown in (0, 2, 5):
            for parse in (parse_distillation, parse_merge):
                result = parse(case, n_shown)  # must not raise
                assert result.ok == (result.error is None)
                if result.ok:
                    accepted += 1
                    assert len(result.ops) <= max(3, n_shown)
                else:
                    rejected += 1
                    assert result.ops == ()
    assert accepted > 0 and rejected > 1000


def test_limits_are_settings():
    long_title = answer([{"op": "add", "title": "t" * 200, "content": "c"}])
    assert not parse_distillation(long_title, 0).ok
    assert parse_distillation(long_title, 0, ParseLimits(max_title_chars=300)).ok
