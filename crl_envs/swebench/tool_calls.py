"""The text syntax in which a language model calls a SWE tool, and its parser.

Holds:
- ``TOOL_CALL_SYNTAX``: how a language model writes a tool call (documented for the prompt), and
  ``TOOL_NAMES``;
- ``ToolCall``, ``ToolCallError``, ``parse_tool_call`` (linear, and refusing text longer than
  ``MAX_ACTION_CHARS``) and ``format_tool_call``.

A tool call is one ``<function=NAME>`` block whose parameters are ``<parameter=KEY>`` blocks;
values are taken verbatim (no escaping, so code is written as is), minus one newline right
after the opening tag and one right before the closing tag. This is the syntax of OpenHands'
and SWE-smith's text prompts, which code models are trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TOOL_CALL_SYNTAX", "TOOL_NAMES", "ToolCall", "ToolCallError", "parse_tool_call",
           "format_tool_call", "MAX_ACTION_CHARS"]

TOOL_CALL_SYNTAX = """\
Call exactly one tool per turn, in this format (values are raw text, no quoting or escaping):

<function=TOOL_NAME>
<parameter=NAME>
value
</parameter>
</function>

Tools:
- bash: run a command in a persistent shell (the working directory, variables, functions
  and aliases carry over). Parameters: command. Commands cannot read stdin; long
  runs are killed after the timeout; output over 16,000 characters is cut.
- str_replace_editor: view and edit files; paths are absolute. Parameters: command (one of
  view, create, str_replace, insert, undo_edit), path, and per command:
    view: view_range (optional, e.g. [11, 30]; -1 as end means to the end). A file is shown
      with line numbers (cat -n); a directory lists files up to 2 levels deep.
    create: file_text. Refuses a file that already exists.
    str_replace: old_str (must match exactly once, whitespace included), new_str.
    insert: insert_line (insert after this line; 0 = at the top), new_str.
    undo_edit: reverts the last edit of path.
- submit: end the episode; the repository's current diff is the answer. No parameters.

Example:
<function=str_replace_editor>
<parameter=command>str_replace</parameter>
<parameter=path>/testbed/pkg/module.py</parameter>
<parameter=old_str>    return a - b</parameter>
<parameter=new_str>    return a + b</parameter>
</function>"""

# tool -> (required parameters, optional parameters)
_PARAMETERS: dict[str, tuple[set[str], set[str]]] = {
    "bash": ({"command"}, set()),
    "str_replace_editor": (
        {"command", "path"},
        {"file_text", "old_str", "new_str", "insert_line", "view_range"},
    ),
    "submit": (set(), set()),
}
TOOL_NAMES: tuple[str, ...] = tuple(_PARAMETERS)

_MAX_NAME = 64  # characters of a tool or parameter name
# An action longer than this is refused before it is parsed: a policy that learns to write
# megabytes per turn must not cost the env more than reading it once.
MAX_ACTION_CHARS = 200_000


class ToolCallError(ValueError):
    """The text is not one well-formed tool call; the message says what is wrong."""


@dataclass
class ToolCall:
    """A parsed tool call: the tool's name and its raw string parameters."""

    name: str
    parameters: dict[str, str] = field(default_factory=dict)


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _tag_end(text: str, start: int, tag: str) -> tuple[str, int] | None:
    """At ``text[start:]``, ``<tag = NAME >`` (whitespace optional): NAME and the index after
    ``>``; ``None`` if the text there is not such a tag. Scans only the tag itself: a name is
    at most ``_MAX_NAME`` characters, so tags without their ``>`` cannot make parsing
    quadratic."""
    at = start + len(tag) + 1
    while at < len(text) and text[at].isspace():
        at += 1
    if at >= len(text) or text[at] != "=":
        return None
    at += 1
    while at < len(text) and text[at].isspace():
        at += 1
    name_start = at
    while at < len(text) and text[at] != ">" and not text[at].isspace():
        at += 1
        if at - name_start > _MAX_NAME:
            return None
    name = text[name_start:at]
    while at < len(text) and text[at].isspace():
        at += 1
    if at >= len(text) or text[at] != ">":
        return None
    return name, at + 1


def _function_blocks(text: str) -> list[tuple[str, str]]:
    """Every ``<function=NAME>BODY</function>`` block (the last may run to the end of the text).

    One pass with ``str.find`` that never rescans text: linear in the length of ``text``,
    where a lazy regex with a fallback alternative is quadratic on unclosed blocks.
    """
    blocks, at = [], 0
    while (start := text.find("<function", at)) != -1:
        tag = _tag_end(text, start, "function")
        if tag is None:
            at = start + len("<function")
            continue
        name, body_start = tag
        close = text.find("</function>", body_start)
        body_end = len(text) if close == -1 else close
        blocks.append((name, text[body_start:body_end]))
        at = len(text) if close == -1 else close + len("</function>")
    return blocks


def _parameter_blocks(body: str) -> list[tuple[str, str]]:
    """The ``<parameter=KEY>VALUE</parameter>`` blocks of a function body, in one linear pass."""
    blocks, at = [], 0
    while (start := body.find("<parameter", at)) != -1:
        tag = _tag_end(body, start, "parameter")
        close = body.find("</parameter>", tag[1]) if tag is not None else -1
        if close == -1:
            raise ToolCallError("a <parameter=NAME> block is not closed with </parameter>")
        blocks.append((tag[0], body[tag[1]:close]))
        at = close + len("</parameter>")
    return blocks


def parse_tool_call(text: str) -> ToolCall:
    """Parse one tool call written in ``TOOL_CALL_SYNTAX``; raise ``ToolCallError`` otherwise.

    Text longer than ``MAX_ACTION_CHARS`` is refused before it is parsed; parsing is linear.

    >>> call = parse_tool_call("<function=bash>\\n<parameter=command>ls -a</parameter>\\n</function>")
    >>> call.name, call.parameters
    ('bash', {'command': 'ls -a'})
    >>> parse_tool_call("ls -a")
    Traceback (most recent call last):
    ...
    crl_envs.swebench.tool_calls.ToolCallError: no tool call found: write <function=TOOL_NAME> ... </function> (tools: bash, str_replace_editor, submit)
    """
    if len(text) > MAX_ACTION_CHARS:
        raise ToolCallError(f"the action is {len(text):,} characters; the limit is "
                            f"{MAX_ACTION_CHARS:,}. Write large files in parts (create, then "
                            "insert)")
    calls = _function_blocks(text)
    if not calls:
        raise ToolCallError("no tool call found: write <function=TOOL_NAME> ... </function> "
                            f"(tools: {', '.join(TOOL_NAMES)})")
    if len(calls) > 1:
        raise ToolCallError(f"{len(calls)} tool calls found; call exactly one tool per turn")
    name, body = calls[0]
    if name not in _PARAMETERS:
        raise ToolCallError(f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}")
    parameters: dict[str, str] = {}
    for key, value in _parameter_blocks(body):
        if key in parameters:
            raise ToolCallError(f"parameter {key!r} given twice")
        parameters[key] = _strip_one_newline(value)
    required, optional = _PARAMETERS[name]
    unknown = set(parameters) - required - optional
    if unknown:
        allowed = ", ".join(sorted(required | optional)) or "none"
        raise ToolCallError(f"{name} takes no parameter {', '.join(sorted(unknown))} "
                            f"(parameters: {allowed})")
    missing = required - set(parameters)
    if missing:
        raise ToolCallError(f"{name} needs the parameter(s) {', '.join(sorted(missing))}")
    with_nul = sorted(key for key, value in parameters.items() if "\x00" in value)
    if with_nul:  # no path, file or command line can hold one
        raise ToolCallError(f"parameter(s) {', '.join(with_nul)} contain a NUL character")
    return ToolCall(name, parameters)


def format_tool_call(name: str, **parameters: object) -> str:
    """Write a tool call in ``TOOL_CALL_SYNTAX`` (what scripted agents and prompts use).

    >>> format_tool_call("submit")
    '<function=submit>\\n</function>'
    """
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<function={name}>\n{body}</function>"
