"""Packed episodes: a multi-turn trajectory as one training row when its prompts only grow.

Holds ``PackedRow`` (the token parts of one row) and ``pack_turns``.

With full history, turn i+1's prompt is turn i's prompt + reply + the next observation, so one
row per turn forward-passes the episode's prefix once per turn. When every prompt extends the
previous prompt + reply token for token, the whole episode is one row instead: the first prompt,
then every token up to the end of the last reply, the replies trained (mask 1) and the
observations between them context only (mask 0). Each reply then sees exactly the tokens it was
sampled after, so its log-probs are those of its own per-turn row.

>>> from types import SimpleNamespace as T
>>> turns = [T(prompt_token_ids=[1, 2], token_ids=[3], logprobs=[-0.5]),
...          T(prompt_token_ids=[1, 2, 3, 9], token_ids=[4, 5], logprobs=[-0.1, -0.2])]
>>> [row] = pack_turns(turns)
>>> row.prompt_ids, row.completion_ids, row.completion_mask, row.old_logprobs
([1, 2], [3, 9, 4, 5], [1, 0, 1, 1], [-0.5, 0.0, -0.1, -0.2])
>>> trimmed = T(prompt_token_ids=[1, 9], token_ids=[4], logprobs=[-0.1])
>>> [r.completion_ids for r in pack_turns([turns[0], trimmed])]  # not a prefix: one row per turn
[[3], [4]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["PackedRow", "pack_turns"]


class _Turn(Protocol):
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]


@dataclass
class PackedRow:
    """The token parts of one training row built from turns (advantage and weight come apart).

    ``completion_mask`` is set (1 = a reply token, 0 = an observation between replies) on a
    packed row and ``None`` on a row of one turn that ``pack_turns`` fell back to; the
    ``old_logprobs`` are the sampler's on reply tokens and 0.0 on the others.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    completion_mask: list[int] | None = None

    @property
    def packed(self) -> bool:
        return self.completion_mask is not None


def pack_turns(turns: Sequence[_Turn]) -> list[PackedRow]:
    """One packed row for the trajectory ``turns`` when each turn's prompt + reply is a prefix of
    the next turn's prompt; otherwise one row per turn (a slid history window, a trimmed prompt, a
    reply re-tokenised differently), which is exact too. Turns without tokens are left out;
    no turn with tokens, no row."""
    turns = [t for t in turns if t.token_ids]
    if not turns:
        return []
    for turn in turns:
        if len(turn.logprobs) != len(turn.token_ids):
            raise ValueError(f"a turn has {len(turn.token_ids)} token ids but "
                             f"{len(turn.logprobs)} log-probs; they must be one per token")
    for before, after in zip(turns, turns[1:], strict=False):
        seen = len(before.prompt_token_ids) + len(before.token_ids)
        if list(after.prompt_token_ids[:seen]) != [*before.prompt_token_ids, *before.token_ids]:
            return [PackedRow(list(t.prompt_token_ids), list(t.token_ids), list(t.logprobs))
                    for t in turns]
    start = len(turns[0].prompt_token_ids)
    last = turns[-1]
    completion = list(last.prompt_token_ids[start:]) + list(last.token_ids)
    mask = [0] * len(completion)
    old = [0.0] * len(completion)
    for turn in turns:
        # A reply's place in the packed completion is where its prompt ends.
        at = len(turn.prompt_token_ids) - start
        mask[at:at + len(turn.token_ids)] = [1] * len(turn.token_ids)
        old[at:at + len(turn.token_ids)] = turn.logprobs
    return [PackedRow(list(turns[0].prompt_token_ids), completion, old, mask)]
