"""The actor-critic gate: before a guided episode, the actor judges the retrieved experience.

Holds ``CRITIC_SCORES`` (accept 1, refine 0.5, reject -1, as the released code), ``GateVerdict``,
``parse_verdict`` and ``gate_messages`` (the chat the actor answers, from
``assets/prompts/actor_critic_gate_{system,user}.txt``).

The verdict shapes the episode and the extractor's credit: reject plays the episode without the
experience, refine replaces it by the actor's own restatement, accept keeps it; the writers of
the entries shown are then credited ``gated_credit(score, critic)`` (``credit.py``). A verdict
that does not parse counts as accept, with ``format_ok`` false, so a malformed reply neither
hides experience from the actor nor punishes the extractor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from crl_harness.experience.entries import clean_text
from crl_harness.experience.prompts import load_prompt
from crl_harness.models.base import Message
from crl_harness.prompting import last_answer_block

__all__ = ["CRITIC_SCORES", "MAX_REFINED_CHARS", "Verdict", "GateVerdict", "parse_verdict",
           "gate_messages"]

Verdict = Literal["accept", "refine", "reject"]

CRITIC_SCORES: dict[str, float] = {"accept": 1.0, "refine": 0.5, "reject": -1.0}
MAX_REFINED_CHARS = 2_000
"""a refined knowledge longer than this is cut (it goes into every prompt of the episode)"""


@dataclass(frozen=True)
class GateVerdict:
    """What the actor decided about the retrieved experience.

    Example:
        >>> v = parse_verdict('<think>off topic</think><answer>{"verdict": "reject"}</answer>')
        >>> v.verdict, v.critic, v.format_ok
        ('reject', -1.0, True)
        >>> v = parse_verdict("east")
        >>> v.verdict, v.critic, v.format_ok, v.error
        ('accept', 1.0, False, 'no <answer>...</answer> block')
    """

    verdict: Verdict
    knowledge: str = ""
    """the restated experience (refine only)"""
    format_ok: bool = True
    error: str = ""

    @property
    def critic(self) -> float:
        """The critic score of the verdict: accept 1, refine 0.5, reject -1."""
        return CRITIC_SCORES[self.verdict]


def _malformed(error: str) -> GateVerdict:
    return GateVerdict("accept", format_ok=False, error=error)


def parse_verdict(text: str) -> GateVerdict:
    """The verdict in the last ``<answer>{"verdict": ...}</answer>`` block of ``text``; anything
    else (no block, not JSON, an unknown verdict, a refine without knowledge) is accept with
    ``format_ok`` false and the reason in ``error``."""
    block = last_answer_block(text)
    if block is None:
        return _malformed("no <answer>...</answer> block")
    try:
        decision = json.loads(block)
    except json.JSONDecodeError as err:
        return _malformed(f"the answer is not JSON ({err.msg})")
    except RecursionError:  # "[[[[..." within a reply
        return _malformed("the answer nests too deeply to be a verdict")
    if not isinstance(decision, dict):
        return _malformed("the answer is not a JSON object")
    verdict = decision.get("verdict")
    if verdict not in CRITIC_SCORES:
        return _malformed(f"unknown verdict {verdict!r}; use accept, refine or reject")
    if verdict != "refine":
        return GateVerdict(verdict)
    knowledge = decision.get("knowledge")
    if not isinstance(knowledge, str) or not knowledge.strip():
        return _malformed("a refine verdict needs a non-empty \"knowledge\" string")
    # JSON escapes can spell lone surrogates ("\\ud83d"), which no tokenizer encodes: cleaned as
    # bank text is, since the knowledge goes into the episode's system prompt.
    return GateVerdict("refine", clean_text(knowledge.strip()[:MAX_REFINED_CHARS]))


def gate_messages(task_prompt: str, observation: str, knowledge: str) -> list[Message]:
    """The gate's chat: the judging instructions, then the actor's own task prompt (without the
    experience), its first observation and the retrieved knowledge."""
    user = load_prompt("actor_critic_gate_user").substitute(
        task_prompt=task_prompt, observation=observation, knowledge=knowledge)
    return [{"role": "system", "content": load_prompt("actor_critic_gate_system").template.strip()},
            {"role": "user", "content": user}]
