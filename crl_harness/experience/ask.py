"""Search-and-ask: during a guided episode the actor may query the bank, and the extractor answers.

Holds the tool's tags (``ASK_OPEN``, ``ASK_CLOSE``: the closing tag is the backend's stop string),
``parse_ask`` (is a reply an ask, and for what), ``AskRecord`` (what one ask turn did, kept on its
``Turn``), ``AskAnswer`` (what the Experience Manager returns), ``tool_instructions`` (the block
added to a guided episode's system prompt), ``answer_prompt`` / ``parse_answer_text`` (the
extractor's side) and the observations the engine gives back (``answer_observation``,
``refused_observation``, ``empty_query_observation``).

An ask does not move the env. At most ``max_asks`` are answered per episode; a later one is
refused with a message that says so (a turn that counts toward the step limit), an empty query
is an invalid action, and a query longer than ``max_query_chars`` is cut before it is sent. The
extractor generation that wrote an answer is credited with the episode's outcome, like one whose
entries were used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from crl_harness.experience.prompts import load_prompt
from crl_harness.prompting import last_answer_block

__all__ = ["ASK_OPEN", "ASK_CLOSE", "NO_KNOWLEDGE", "AskStatus", "AskRecord", "AskAnswer",
           "parse_ask", "tool_instructions", "answer_prompt", "parse_answer_text",
           "answer_observation", "refused_observation", "empty_query_observation"]

ASK_OPEN = "<knowledge_search_and_ask>"
ASK_CLOSE = "</knowledge_search_and_ask>"
NO_KNOWLEDGE = "No relevant knowledge found."

AskStatus = Literal["answered", "refused", "empty"]

# An ask is the tool block, after an optional think block; what follows the closing tag is
# ignored (the stop string ends generation there; a backend without stop strings may run on).
_ASK = re.compile(r"\A\s*(?:<think>.*?</think>\s*)?" + re.escape(ASK_OPEN) + r"(?P<query>.*?)"
                  r"(?:" + re.escape(ASK_CLOSE) + r"|\Z)", re.DOTALL)


@dataclass
class AskRecord:
    """One ask turn: the query as sent (cut to the bound), the answer shown to the actor, and
    the extractor generation that wrote it (None: no generation, e.g. nothing in the bank)."""

    query: str
    status: AskStatus
    answer: str = ""
    generation_id: str | None = None
    cut: bool = False
    """the actor's query was longer than the bound and was cut"""


@dataclass(frozen=True)
class AskAnswer:
    """The Experience Manager's answer to an ask (plain data: it may cross a process)."""

    text: str
    generation_id: str | None = None


def parse_ask(text: str, stopped: bool = True) -> str | None:
    """The query of a reply that asks (``<think>..</think><knowledge_search_and_ask>QUERY
    </knowledge_search_and_ask>``), unstripped; None when the reply is not an ask.

    A reply that stopped (``stopped``: the end-of-turn token or a stop string, which some servers
    leave out of the text) may lack the closing tag; one cut by the token limit may not.

    Example:
        >>> parse_ask("<think>stuck</think><knowledge_search_and_ask>where are the stairs?"
        ...           "</knowledge_search_and_ask>")
        'where are the stairs?'
        >>> parse_ask("<think>go</think><answer>east</answer>") is None
        True
        >>> parse_ask("<knowledge_search_and_ask>where", stopped=False) is None
        True
    """
    match = _ASK.match(text)
    if match is None:
        return None
    if ASK_CLOSE not in text[match.start("query"):] and not stopped:
        return None
    return match["query"]


def tool_instructions(max_asks: int) -> str:
    """The block a guided episode's system prompt gets when search-and-ask is on."""
    return load_prompt("search_and_ask_tool").substitute(max_asks=max_asks).strip()


def answer_prompt(env_id: str, query: str, entries: str) -> str:
    """The extractor's prompt for one ask: the env, the actor's query, the entries found."""
    return load_prompt("search_and_ask_answer").substitute(env_id=env_id, query=query,
                                                           entries=entries)


def parse_answer_text(text: str) -> str | None:
    """The extractor's answer: the last non-empty ``<answer>...</answer>`` block, else None.

    >>> parse_answer_text("<think>hm</think><answer> Go east. </answer>")
    'Go east.'
    """
    block = (last_answer_block(text) or "").strip()
    return block or None


def answer_observation(answer: str, observation: str) -> str:
    """What the actor sees after an answered ask: the answer, then the unchanged state."""
    return f"Answer from the knowledge base:\n{answer}\n\n{observation}"


def refused_observation(max_asks: int, observation: str) -> str:
    """What the actor sees after an ask beyond the limit."""
    return (f"The knowledge base was not asked: the limit of {max_asks} asks per episode is "
            f"reached. Reply with an action.\n\n{observation}")


def empty_query_observation(observation: str) -> str:
    """What the actor sees after an ask with an empty query (an invalid action)."""
    return (f"Invalid ask: the {ASK_OPEN} block is empty. Nothing happened; write the question "
            f"inside the block, or reply with an action.\n\n{observation}")
