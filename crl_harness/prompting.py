"""Prompts for the actor and the strict parser of its answers.

Holds:
- ``ANSWER_FORMAT``: the instruction that asks for the paper's ``<think>...</think><answer>ACTION</answer>``.
- ``system_prompt``: env instructions + answer format + the experience block when present.
- ``cut_experience``: the experience block cut to what fits (``EXPERIENCE_CUT_NOTE`` says so);
  ``EXPERIENCE_SHARE``: how much of the first prompt's free room it may take.
- ``parse_answer`` / ``ParsedAnswer``: the strict parser; anything else is a format failure.
- ``last_answer_block``: the body of a reply's last ``<answer>...</answer>`` (the gate's verdict,
  the extractor's answers).
- ``Conversation``: one episode's messages, with the history setting (all turns that fit the
  context, or the last k turns).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from crl_harness.models.base import Message

__all__ = [
    "ANSWER_FORMAT",
    "EXPERIENCE_HEADER",
    "EXPERIENCE_CUT_NOTE",
    "EXPERIENCE_SHARE",
    "cut_experience",
    "ParsedAnswer",
    "parse_answer",
    "last_answer_block",
    "format_error_message",
    "system_prompt",
    "Conversation",
]

ANSWER_FORMAT = (
    "Reply in exactly this format and nothing else:\n"
    "<think>your short reasoning</think><answer>ONE ACTION</answer>\n"
    "The answer holds a single action written as the rules above say."
)
EXPERIENCE_HEADER = "Distilled knowledge from earlier experience (use it when it helps):"
EXPERIENCE_CUT_NOTE = "[The rest of this knowledge was cut to fit the model's context.]"
EXPERIENCE_SHARE = 0.5
"""the share of the room the first prompt leaves in the context (without experience) that the
experience may fill: the rest is for the history and for longer observations later on"""

# The seam between the two blocks. The reply's ends are checked with str methods and the seam
# searched once: a regex over the whole reply with two lazy groups is quadratic on replies
# repeating the tags (4,000 repeats took seconds).
_SEAM = re.compile(r"</think>\s*<answer>")
_TAG = re.compile(r"</?(think|answer)>")


@dataclass(frozen=True)
class ParsedAnswer:
    """What the parser made of one reply: the action, or the reason it has none."""

    action: str | None
    think: str = ""
    error: str = ""

    @property
    def format_ok(self) -> bool:
        return self.action is not None


def parse_answer(text: str) -> ParsedAnswer:
    """Parse ``<think>...</think><answer>ACTION</answer>`` strictly.

    The reply must be one think block then one answer block, with nothing but whitespace around
    them, no nested tags, and a non-empty single-line action.

    Example:
        >>> parse_answer("<think>go on</think><answer> east </answer>").action
        'east'
        >>> parse_answer("east").error
        'no <think>...</think><answer>...</answer> block'
    """
    body = text.strip()
    seam = None
    if body.startswith("<think>") and body.endswith("</answer>"):
        seam = _SEAM.search(body, len("<think>"), len(body) - len("</answer>"))
    if seam is None:
        return ParsedAnswer(None, error="no <think>...</think><answer>...</answer> block")
    think, answer = body[len("<think>"):seam.start()], body[seam.end():-len("</answer>")].strip()
    if _TAG.search(think) or _TAG.search(answer):
        return ParsedAnswer(None, think, error="nested or repeated <think>/<answer> tags")
    if not answer:
        return ParsedAnswer(None, think, error="the <answer> block is empty")
    if "\n" in answer:
        return ParsedAnswer(None, think, error="the <answer> block holds more than one line")
    return ParsedAnswer(answer, think.strip())


def last_answer_block(text: str) -> str | None:
    """The body of the last ``<answer>...</answer>`` of ``text`` (None when there is none), in
    linear time (a regex scan for every ``<answer>`` of ``"<answer>" * 8000`` took seconds).

    >>> last_answer_block("<answer>a</answer> then <answer> b </answer>")
    ' b '
    >>> last_answer_block("<answer>" * 3) is None
    True
    """
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>"):end] if start >= 0 else None


def format_error_message(error: str) -> str:
    """The observation an agent gets after a reply the parser rejected (the env did not move)."""
    return (
        f"Invalid format: {error}. Nothing happened. Reply as "
        "<think>your short reasoning</think><answer>ONE ACTION</answer>."
    )


def system_prompt(instructions: str, experience: str = "", task: str = "",
                  answer_format: str = ANSWER_FORMAT) -> str:
    """Env instructions, then the task when given, the answer format, and the experience block.
    ``answer_format`` says how to answer (the TRL adapter's agents call a tool instead).

    Example:
        >>> print(system_prompt("Move with north/south.", experience="Walls block moves."))
        Move with north/south.
        <BLANKLINE>
        Reply in exactly this format and nothing else:
        <think>your short reasoning</think><answer>ONE ACTION</answer>
        The answer holds a single action written as the rules above say.
        <BLANKLINE>
        Distilled knowledge from earlier experience (use it when it helps):
        Walls block moves.
    """
    parts = [instructions.strip()] if instructions.strip() else []
    if task.strip():
        parts.append(f"Your task: {task.strip()}")
    parts.append(answer_format)
    if experience.strip():
        parts.append(f"{EXPERIENCE_HEADER}\n{experience.strip()}")
    return "\n\n".join(parts)


def cut_experience(units: Sequence[str], fits: Callable[[str], bool]) -> tuple[str, int]:
    """The experience ``units`` (the retrieved entries' lines, best first) joined by newlines,
    cut until ``fits(text)``: the most leading units that fit whole, else the longest head of
    the first, then ``EXPERIENCE_CUT_NOTE``; "" when not even that fits. Returns the text and
    how many units it shows (whole or in part), so that only those are credited.

    Example:
        >>> cut_experience(["- a", "- b"], lambda text: len(text) < 100)
        ('- a\\n- b', 2)
        >>> lines = ["- " + "a" * 40, "- " + "b" * 40, "- " + "c" * 40]
        >>> text, shown = cut_experience(lines, lambda text: len(text) <= 110)
        >>> shown, text == lines[0] + "\\n" + EXPERIENCE_CUT_NOTE
        (1, True)
        >>> cut_experience(["- " + "x" * 1000], lambda text: len(text) <= 80)[0][:10]
        '- xxxxxxxx'
    """
    whole = "\n".join(units)
    if not units or fits(whole):
        return whole, len(units)

    def shown(kept: Sequence[str]) -> str:
        return "\n".join([*kept, EXPERIENCE_CUT_NOTE])

    # Binary searches (a prompt is tokenised O(log n) times): the most units that fit whole ...
    low, high = 0, len(units) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if fits(shown(units[:middle])):
            low = middle
        else:
            high = middle - 1
    if low:
        return shown(units[:low]), low
    # ... else the longest head of the first one (a single entry larger than the context)
    first = units[0]
    low, high = 0, len(first) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if fits(shown([first[:middle]])):
            low = middle
        else:
            high = middle - 1
    return (shown([first[:low]]), 1) if low else ("", 0)


@dataclass
class Conversation:
    """One episode as chat messages: system prompt, then observation/reply turns.

    ``history=None`` keeps every earlier turn that fits in the token budget; when the budget is
    exceeded the oldest turns are dropped ``trim_block`` at a time, so the kept history starts at
    the same turn for several turns in a row and a backend with KV reuse re-prefills only when the
    window jumps (``trim_block=1`` keeps as much as fits, re-prefilling every turn once full).
    ``history=k`` keeps at most the last k earlier turns (the prompt then changes every turn past
    k). The current observation and the system prompt are always kept.

    Example:
        >>> conv = Conversation("rules", history=1)
        >>> conv.observe("obs 1"); conv.reply("a 1"); conv.observe("obs 2"); conv.reply("a 2")
        >>> conv.observe("obs 3")
        >>> [m["content"] for m in conv.messages()]
        ['rules', 'obs 2', 'a 2', 'obs 3']
    """

    system: str
    history: int | None = None
    turns: list[tuple[str, str]] = field(default_factory=list)  # (observation, reply)
    trim_block: int = 4
    current: str = ""

    def observe(self, observation: str) -> None:
        self.current = observation

    def reply(self, text: str) -> None:
        self.turns.append((self.current, text))
        self.current = ""

    def messages(self, budget: int | None = None,
                 count_tokens: Callable[[list[Message]], int] | None = None) -> list[Message]:
        """The prompt for the next reply, trimmed to ``budget`` tokens when both are given."""
        if self.history is None:
            turns = self.turns
        else:
            turns = self.turns[-self.history:] if self.history > 0 else []
        messages = self._render(turns)
        if budget is None or count_tokens is None or count_tokens(messages) <= budget:
            return messages
        # Binary search for the fewest oldest turns to drop: O(log n) token counts of the prompt.
        low, high = 1, len(turns)  # dropping `high` turns always "fits" (nothing left to drop)
        while low < high:
            middle = (low + high) // 2
            if count_tokens(self._render(turns[middle:])) <= budget:
                high = middle
            else:
                low = middle + 1
        # Round the drop up to whole blocks: the window's start then moves every few turns only.
        drop = min(len(turns), -(-high // self.trim_block) * self.trim_block)
        return self._render(turns[drop:])

    def _render(self, turns: list[tuple[str, str]]) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": self.system}]
        for observation, reply in turns:
            messages.append({"role": "user", "content": observation})
            messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": self.current})
        return messages
