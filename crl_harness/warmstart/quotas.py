"""How the extractor's warm-start samples are shared over its answers.

Holds ``ANSWER_CLASSES``, ``class_quotas`` (as many samples of each answer as of the others; with
key lessons half of them ``add``), ``adds_per_key`` (the most adds of one retrieval key) and their
two shares, ``KEY_ADD_SHARE`` and ``ADDS_PER_KEY_SHARE``.
"""

from __future__ import annotations

import math

__all__ = ["ANSWER_CLASSES", "KEY_ADD_SHARE", "ADDS_PER_KEY_SHARE", "class_quotas",
           "adds_per_key"]

ANSWER_CLASSES = ("add", "return", "upvote", "downvote")
"""what ``extractor_sample`` answers, in the order a count not divisible by four fills them"""
KEY_ADD_SHARE = 1 / 2
"""with key lessons, the share of the samples that answer ``add`` (``class_quotas``): a key's
lesson is not in the transcript (a sweep is its start cell's), so the extractor learns each key's
lesson by heart from the adds of that key, while the other answers are read from the transcript
(at 256 samples, a quarter of them adds: votes 12/12 right, sweeps 0.32 of the oracle's wins on
unseen levels of their keys; at 384, half adds: sweeps 0.89, but votes 2/8 and 1/8, answered
with adds: benchmarks/RESULTS.md)"""
ADDS_PER_KEY_SHARE = 1 / 20
"""with key lessons, the most ``add`` samples of one key, as a share of the adds (at least 2):
adds spread over keys rather than pile on the commonest (cpu-demo's warm start at 64 adds and a
cap of 2: 20 of the 25 dark Room start cells, 17 without the cap)"""


def class_quotas(count: int, lesson: str = "route") -> dict[str, int]:
    """``count`` samples shared over ``ANSWER_CLASSES`` as evenly as they divide; with
    ``lesson`` ``key``, ``KEY_ADD_SHARE`` of them (rounded) answer ``add`` and the rest are
    shared by the others.

    >>> class_quotas(10)
    {'add': 3, 'return': 3, 'upvote': 2, 'downvote': 2}
    >>> class_quotas(10, "key")
    {'add': 5, 'return': 2, 'upvote': 2, 'downvote': 1}
    """
    fixed = {"add": round(count * KEY_ADD_SHARE)} if lesson == "key" else {}
    rest = [name for name in ANSWER_CLASSES if name not in fixed]
    share, extra = divmod(count - sum(fixed.values()), len(rest))
    quotas = {**fixed, **{name: share + (i < extra) for i, name in enumerate(rest)}}
    return {name: quotas[name] for name in ANSWER_CLASSES}


def adds_per_key(adds: int) -> int:
    """With key lessons, the most ``add`` samples of one key when ``adds`` are wanted
    (``ADDS_PER_KEY_SHARE`` of them, at least 2).

    >>> adds_per_key(64), adds_per_key(192)
    (4, 10)
    """
    return max(2, math.ceil(adds * ADDS_PER_KEY_SHARE))
