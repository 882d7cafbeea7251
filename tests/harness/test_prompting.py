"""The strict answer parser and the prompt/history builder."""

from __future__ import annotations

import pytest

from crl_harness.prompting import (
    EXPERIENCE_HEADER,
    Conversation,
    format_error_message,
    parse_answer,
    system_prompt,
)


@pytest.mark.parametrize("text, action", [
    ("<think>wall north</think><answer>east</answer>", "east"),
    ("  <think>\nmulti\nline\n</think>\n<answer> pick up key </answer>\n", "pick up key"),
    ("<think></think><answer>search[red shoes]</answer>", "search[red shoes]"),
])
def test_well_formed_answers_parse(text, action):
    parsed = parse_answer(text)
    assert parsed.format_ok and parsed.action == action and not parsed.error


@pytest.mark.parametrize("text, error", [
    ("east", "no <think>"),
    ("<answer>east</answer>", "no <think>"),
    ("<think>x</think>", "no <think>"),
    ("<think>x</think><answer>east</answer> and then west", "no <think>"),
    ("I think <think>x</think><answer>east</answer>", "no <think>"),
    ("<think>x</think><answer>   </answer>", "empty"),
    ("<think>x</think><answer>east\nwest</answer>", "more than one line"),
    ("<think>a</think><answer>b</answer><think>c</think><answer>d</answer>", "nested or repeated"),
    ("<think>x<answer>y</answer></think><answer>east</answer>", "nested or repeated"),
    ("<think>x</think><answer>east", "no <think>"),  # cut by max_new_tokens
    ("", "no <think>"),
])
def test_malformed_answers_are_format_failures(text, error):
    parsed = parse_answer(text)
    assert not parsed.format_ok and parsed.action is None and error in parsed.error


def test_format_error_message_names_the_format():
    assert "<answer>" in format_error_message("the <answer> block is empty")


def test_system_prompt_holds_instructions_task_format_and_experience():
    prompt = system_prompt("RULES", experience="- tip", task="reach the stairs")
    assert prompt.index("RULES") < prompt.index("reach the stairs") < prompt.index("<answer>")
    assert prompt.endswith(f"{EXPERIENCE_HEADER}\n- tip")
    assert EXPERIENCE_HEADER not in system_prompt("RULES")


def _play(conv: Conversation, turns: int) -> None:
    for i in range(turns):
        conv.observe(f"obs {i}")
        conv.reply(f"reply {i}")
    conv.observe(f"obs {turns}")


def test_history_last_k_and_whole():
    whole, last2, none = Conversation("S"), Conversation("S", history=2), Conversation("S", 0)
    for conv in (whole, last2, none):
        _play(conv, 4)
    assert len(whole.messages()) == 1 + 2 * 4 + 1
    assert [m["content"] for m in last2.messages()] == ["S", "obs 2", "reply 2", "obs 3", "reply 3",
                                                         "obs 4"]
    assert [m["content"] for m in none.messages()] == ["S", "obs 4"]
    roles = [m["role"] for m in whole.messages()]
    assert roles[0] == "system" and roles[-1] == "user" and roles[1:-1:2] == ["user"] * 4


def test_history_is_trimmed_oldest_first_to_the_token_budget():
    conv = Conversation("S")
    _play(conv, 10)
    count = lambda messages: sum(len(m["content"]) for m in messages)  # noqa: E731
    messages = conv.messages(budget=40, count_tokens=count)
    assert count(messages) <= 40
    assert messages[0]["content"] == "S" and messages[-1]["content"] == "obs 10"
    assert messages[-2]["content"] == "reply 9"  # the newest turns survive
    # Even an impossible budget keeps the system prompt and the current observation.
    assert [m["content"] for m in conv.messages(budget=1, count_tokens=count)] == ["S", "obs 10"]


def test_budget_trimming_drops_whole_blocks_so_the_prefix_stays_stable():
    count = lambda messages: sum(len(m["content"]) for m in messages)  # noqa: E731
    conv = Conversation("S", trim_block=4)
    starts = []
    for turn in range(1, 25):
        conv.observe(f"obs {turn:02d}")
        messages = conv.messages(budget=120, count_tokens=count)
        assert count(messages) <= 120 and messages[-1]["content"] == f"obs {turn:02d}"
        starts.append(messages[1]["content"])
        conv.reply(f"reply {turn:02d}")
    # Once the budget is reached, the window's first turn changes at most every 4 turns.
    changes = [i for i in range(1, len(starts)) if starts[i] != starts[i - 1]]
    assert changes and all(b - a >= 4 for a, b in zip(changes, changes[1:], strict=False))
    exact = Conversation("S", trim_block=1)  # as much as fits: the start moves every turn
    for turn in range(1, 25):
        exact.observe(f"obs {turn:02d}")
        if turn > 10:  # full: everything that fits is kept, whatever turn that starts at
            assert count(exact.messages(budget=120, count_tokens=count)) > 120 - 14
        exact.reply(f"reply {turn:02d}")
