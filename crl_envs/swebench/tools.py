"""The agent's tools for SWE tasks, with SWE-agent's semantics, and the text syntax to call them.

Holds:
- ``TOOL_CALL_SYNTAX``: how a language model writes a tool call (documented for the prompt).
- ``ToolCall``, ``ToolCallError``, ``parse_tool_call``: the text syntax and its parser.
- ``ToolResult``: the observation of one call, whether it was valid, whether it submitted.
- ``Tools``: ``bash`` (persistent shell with a timeout and the exit code),
  ``str_replace_editor`` (``view``, ``create``, ``str_replace``, ``insert``, ``undo_edit``) and
  ``submit``, over any ``Sandbox``.

A tool call is one ``<function=NAME>`` block whose parameters are ``<parameter=KEY>`` blocks;
values are taken verbatim (no escaping, so code is written as is), minus one newline right
after the opening tag and one right before the closing tag. This is the syntax of OpenHands'
and SWE-smith's text prompts, which code models are trained on.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from crl_envs.swebench.sandbox import (
    OUTPUT_LIMIT,
    FileTooLargeError,
    PathOutsideSandboxError,
    Sandbox,
    SandboxError,
    cut_output,
)

__all__ = [
    "TOOL_CALL_SYNTAX",
    "TOOL_NAMES",
    "ToolCall",
    "ToolCallError",
    "ToolResult",
    "Tools",
    "parse_tool_call",
    "format_tool_call",
    "MAX_ACTION_CHARS",
    "MAX_EDITOR_FILE_BYTES",
]

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

_EDITOR_COMMANDS: dict[str, set[str]] = {
    "view": set(),
    "create": {"file_text"},
    "str_replace": {"old_str"},
    "insert": {"insert_line", "new_str"},
    "undo_edit": set(),
}

_SNIPPET_LINES = 4
_MAX_NAME = 64  # characters of a tool or parameter name
MAX_COMMAND_BYTES = 100_000
# An action longer than this is refused before it is parsed: a policy that learns to write
# megabytes per turn must not cost the env more than reading it once.
MAX_ACTION_CHARS = 200_000
# The editor holds a file, its lines and its edit history in memory; larger files are refused
# (bash tools such as sed, head and grep stream them).
MAX_EDITOR_FILE_BYTES = 2_000_000
# Text the edit history (for undo_edit) keeps, over all files.
MAX_HISTORY_CHARS = 20_000_000


class ToolCallError(ValueError):
    """The text is not one well-formed tool call; the message says what is wrong."""


@dataclass
class ToolCall:
    """A parsed tool call: the tool's name and its raw string parameters."""

    name: str
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass
class ToolResult:
    """What one tool call did: the observation text, whether the call was valid (a refused or
    malformed call changes nothing), and whether it was ``submit``."""

    output: str
    valid: bool = True
    submitted: bool = False


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
    crl_envs.swebench.tools.ToolCallError: no tool call found: write <function=TOOL_NAME> ... </function> (tools: bash, str_replace_editor, submit)
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


def _numbered(text: str, first_line: int = 1) -> str:
    # cat -n layout, as SWE-agent shows files; bytes that are not UTF-8 show as U+FFFD (the file
    # keeps them: the sandbox reads them as surrogate escapes)
    shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return "\n".join(f"{number:6}\t{line}"
                     for number, line in enumerate(shown.split("\n"), start=first_line))


class Tools:
    """``bash``, ``str_replace_editor`` and ``submit`` over one sandbox, with edit history.

    ``call(text)`` parses and runs one tool call and never raises for anything a model writes:
    a malformed or refused call is a ``ToolResult`` with ``valid=False`` and the reason.

    Example:
        >>> import tempfile, pathlib, warnings
        >>> from crl_envs.swebench.sandbox import LocalSandbox
        >>> src = pathlib.Path(tempfile.mkdtemp()); _ = (src / "a.py").write_text("x = 1\\n")
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     tools = Tools(LocalSandbox(src))
        >>> path = tools.sandbox.repo_dir + "/a.py"
        >>> result = tools.call(format_tool_call("str_replace_editor", command="str_replace",
        ...                                      path=path, old_str="x = 1", new_str="x = 2"))
        >>> result.valid, tools.sandbox.read_file(path)
        (True, 'x = 2\\n')
        >>> tools.call("<function=bash>").valid
        False
        >>> tools.sandbox.close()
    """

    def __init__(self, sandbox: Sandbox, command_timeout: float = 120.0) -> None:
        self.sandbox = sandbox
        self.command_timeout = command_timeout
        # path -> earlier versions of the file, None where it did not exist (before `create`)
        self._history: dict[str, list[str | None]] = {}
        # Paths in the order their versions were kept; the oldest versions go first when the
        # kept text passes MAX_HISTORY_CHARS (a long episode of edits on big files).
        self._kept_order: deque[str] = deque()
        self._kept_chars = 0

    def call(self, text: str) -> ToolResult:
        """Parse ``text`` as one tool call and run it."""
        try:
            call = parse_tool_call(text)
        except ToolCallError as err:
            return ToolResult(f"Invalid tool call: {err}.\n\n{TOOL_CALL_SYNTAX}", valid=False)
        if call.name == "submit":
            return ToolResult("Submitted.", submitted=True)
        if call.name == "bash":
            result = self.bash(call.parameters["command"])
        else:
            result = self.editor(**call.parameters)
        if len(result.output) > OUTPUT_LIMIT + 1_000:  # room for the exit-code line of bash
            result.output = cut_output(result.output)
        return result

    # ------------------------------------------------------------------ bash
    def bash(self, command: str) -> ToolResult:
        """Run ``command`` in the persistent shell; the observation ends with the exit code."""
        if not command.strip():
            return ToolResult("The bash command is empty; write a command to run.", valid=False)
        size = len(command.encode("utf-8"))
        if size > MAX_COMMAND_BYTES:  # the kernel's limit on one argument is 128 KiB
            return ToolResult(f"The bash command is {size:,} bytes; the limit is "
                              f"{MAX_COMMAND_BYTES:,}. Write long files with "
                              "str_replace_editor create.", valid=False)
        try:
            result = self.sandbox.run(command, timeout=self.command_timeout)
        except SandboxError as err:
            return ToolResult(f"The command could not run: {err}", valid=False)
        output = result.output if result.output else "(no output)\n"
        if not output.endswith("\n"):
            output += "\n"
        if result.timed_out:
            return ToolResult(f"{output}[timed out after {self.command_timeout:g} seconds; the "
                              "command and its child processes were killed]")
        return ToolResult(f"{output}[exit code {result.exit_code}]")

    # ------------------------------------------------------------------ editor
    def editor(self, command: str, path: str, **args: str) -> ToolResult:
        """SWE-agent's ``str_replace_editor``: refusals come back as invalid results."""
        if command not in _EDITOR_COMMANDS:
            return ToolResult(f"Unknown str_replace_editor command {command!r}; commands: "
                              f"{', '.join(_EDITOR_COMMANDS)}.", valid=False)
        missing = _EDITOR_COMMANDS[command] - set(args)
        if missing:
            return ToolResult(f"str_replace_editor {command} needs the parameter(s) "
                              f"{', '.join(sorted(missing))}.", valid=False)
        if not path.startswith("/"):
            suggestion = f"{self.sandbox.repo_dir.rstrip('/')}/{path.lstrip('./')}"
            return ToolResult(f"The path {path} is not an absolute path; it should start with "
                              f"`/`. Maybe you meant {suggestion}?", valid=False)
        try:
            self.sandbox.check_path(path)
            kind = self.sandbox.path_kind(path)
            if command == "create":
                return self._create(path, kind, args["file_text"])
            if kind is None:
                return ToolResult(f"The path {path} does not exist. Please provide a valid path.",
                                  valid=False)
            if kind == "dir" and command != "view":
                return ToolResult(f"The path {path} is a directory; only `view` works on "
                                  "directories.", valid=False)
            if command == "view":
                return self._view(path, kind, args.get("view_range"))
            if command == "str_replace":
                return self._str_replace(path, args["old_str"], args.get("new_str", ""))
            if command == "insert":
                return self._insert(path, args["insert_line"], args["new_str"])
            return self._undo(path)
        except PathOutsideSandboxError as err:
            return ToolResult(f"Refused: {err}", valid=False)
        except FileTooLargeError as err:
            return ToolResult(f"str_replace_editor {command} refused: {err}", valid=False)
        except UnicodeEncodeError as err:
            return ToolResult(f"str_replace_editor {command} refused: the text holds a character "
                              f"that cannot be written as UTF-8 ({err.reason}).", valid=False)
        except (OSError, SandboxError) as err:
            return ToolResult(f"str_replace_editor {command} failed on {path}: {err}",
                              valid=False)

    def _view(self, path: str, kind: str, view_range: str | None) -> ToolResult:
        if kind == "dir":
            if view_range:
                return ToolResult("view_range applies to files, not directories.", valid=False)
            listing = cut_output("\n".join(self.sandbox.list_dir(path, depth=2)))
            return ToolResult(f"Here are the files and directories up to 2 levels deep in {path}, "
                              f"excluding hidden items:\n{path}\n{listing}")
        # Raw text, tabs included: SWE-agent expands tabs and writes them back expanded, which
        # rewrites every tab-indented file it touches; here an edit changes only what it names.
        text = self._read(path)
        lines = text.split("\n")
        first = 1
        if view_range:
            bounds = _parse_range(view_range)
            if bounds is None:
                return ToolResult(f"Invalid view_range {view_range!r}: give two integers, e.g. "
                                  "[11, 30].", valid=False)
            first, last = bounds
            if not 1 <= first <= len(lines):
                return ToolResult(f"Invalid view_range {view_range}: its first element {first} "
                                  f"should be within [1, {len(lines)}].", valid=False)
            if last != -1 and not first <= last <= len(lines):
                return ToolResult(f"Invalid view_range {view_range}: its second element {last} "
                                  f"should be -1 or within [{first}, {len(lines)}].", valid=False)
            lines = lines[first - 1:] if last == -1 else lines[first - 1:last]
        numbered = _numbered("\n".join(lines), first)
        shown = cut_output(numbered)
        if len(numbered) > OUTPUT_LIMIT:
            shown += "\nUse view_range to see the lines after the cut."
        return ToolResult(f"Here's the result of running `cat -n` on {path}:\n{shown}")

    def _create(self, path: str, kind: str | None, file_text: str) -> ToolResult:
        if kind is not None:
            return ToolResult(f"File already exists at: {path}. Cannot overwrite files using "
                              "command `create`.", valid=False)
        self.sandbox.write_file(path, file_text)
        self._remember(path, None)
        return ToolResult(f"File created successfully at: {path}")

    def _read(self, path: str) -> str:
        return self.sandbox.read_file(path, max_bytes=MAX_EDITOR_FILE_BYTES)

    def _str_replace(self, path: str, old_str: str, new_str: str) -> ToolResult:
        text = self._read(path)
        count = text.count(old_str) if old_str else 0
        if count == 0:
            return ToolResult(f"No replacement was performed, old_str `{_quote(old_str)}` did "
                              f"not appear verbatim in {path}.", valid=False)
        if count > 1:
            starts = [m.start() for m in re.finditer(re.escape(old_str), text)]
            lines = [text.count("\n", 0, start) + 1 for start in starts]
            return ToolResult(f"No replacement was performed. Multiple occurrences of old_str "
                              f"`{_quote(old_str)}` in lines {lines[:20]}. Please ensure it is "
                              "unique.", valid=False)
        self._remember(path, text)
        new_text = text.replace(old_str, new_str)
        self.sandbox.write_file(path, new_text)
        edit_line = text.split(old_str)[0].count("\n")
        return ToolResult(self._edited(path, new_text, edit_line, new_str.count("\n")))

    def _insert(self, path: str, insert_line: str, new_str: str) -> ToolResult:
        text = self._read(path)
        lines = text.split("\n")
        try:
            at = int(insert_line.strip())
        except ValueError:
            at = -1
        if not 0 <= at <= len(lines):
            return ToolResult(f"Invalid `insert_line` parameter: {insert_line}. It should be "
                              f"within the range of lines of the file: [0, {len(lines)}].",
                              valid=False)
        self._remember(path, text)
        new_lines = new_str.split("\n")
        new_text = "\n".join(lines[:at] + new_lines + lines[at:])
        self.sandbox.write_file(path, new_text)
        return ToolResult(self._edited(path, new_text, at, len(new_lines) - 1))

    def _undo(self, path: str) -> ToolResult:
        history = self._history.get(path)
        if not history:
            return ToolResult(f"No edit history found for {path}.", valid=False)
        previous = history.pop()
        self._kept_chars -= len(previous or "")
        if previous is None:
            self.sandbox.remove_file(path)
            return ToolResult(f"Last edit to {path} undone successfully (the file it created was "
                              "removed).")
        self.sandbox.write_file(path, previous)
        return ToolResult(f"Last edit to {path} undone successfully. Here's the result of running "
                          f"`cat -n` on {path}:\n{cut_output(_numbered(previous))}")

    def _remember(self, path: str, text: str | None) -> None:
        """Keep ``text`` as the version of ``path`` before an edit (``None``: it did not exist)."""
        self._history.setdefault(path, []).append(text)
        self._kept_order.append(path)
        self._kept_chars += len(text or "")
        while self._kept_chars > MAX_HISTORY_CHARS and self._kept_order:
            versions = self._history.get(self._kept_order.popleft())
            if versions:
                self._kept_chars -= len(versions.pop(0) or "")

    @staticmethod
    def _edited(path: str, new_text: str, edit_line: int, added_lines: int) -> str:
        lines = new_text.split("\n")
        start = max(0, edit_line - _SNIPPET_LINES)
        end = edit_line + added_lines + _SNIPPET_LINES + 1
        snippet = _numbered("\n".join(lines[start:end]), start + 1)
        return (f"The file {path} has been edited. Here's the result of running `cat -n` on a "
                f"snippet of {path}:\n{snippet}\nReview the changes and make sure they are as "
                "expected. Edit the file again if necessary.")


def _quote(text: str, limit: int = 300) -> str:
    """``text`` for an error message: long strings are shortened, not echoed whole."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _parse_range(value: str) -> tuple[int, int] | None:
    numbers = re.findall(r"-?\d+", value)
    if len(numbers) != 2 or re.sub(r"[-\d\s,\[\]()]", "", value):
        return None
    return int(numbers[0]), int(numbers[1])
