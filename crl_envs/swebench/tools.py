"""The agent's tools for SWE tasks, with SWE-agent's semantics.

Holds:
- ``ToolResult``: the observation of one call, whether it was valid, whether it submitted.
- ``Tools``: ``bash`` (persistent shell with a timeout and the exit code),
  ``str_replace_editor`` (``view``, ``create``, ``str_replace``, ``insert``, ``undo_edit``) and
  ``submit``, over any ``Sandbox``.

The text syntax of a tool call and its parser (``TOOL_CALL_SYNTAX``, ``ToolCall``,
``ToolCallError``, ``parse_tool_call``, ``format_tool_call``) live in ``tool_calls``; they are
imported here too, where they have always been importable from.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from crl_envs.swebench.sandbox import (
    OUTPUT_LIMIT,
    FileTooLargeError,
    PathOutsideSandboxError,
    Sandbox,
    SandboxError,
    cut_output,
)
from crl_envs.swebench.tool_calls import (
    MAX_ACTION_CHARS,
    TOOL_CALL_SYNTAX,
    TOOL_NAMES,
    ToolCall,
    ToolCallError,
    format_tool_call,
    parse_tool_call,
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

_EDITOR_COMMANDS: dict[str, set[str]] = {
    "view": set(),
    "create": {"file_text"},
    "str_replace": {"old_str"},
    "insert": {"insert_line", "new_str"},
    "undo_edit": set(),
}

_SNIPPET_LINES = 4
MAX_COMMAND_BYTES = 100_000
# The editor holds a file, its lines and its edit history in memory; larger files are refused
# (bash tools such as sed, head and grep stream them).
MAX_EDITOR_FILE_BYTES = 2_000_000
# Text the edit history (for undo_edit) keeps, over all files.
MAX_HISTORY_CHARS = 20_000_000


@dataclass
class ToolResult:
    """What one tool call did: the observation text, whether the call was valid (a refused or
    malformed call changes nothing), and whether it was ``submit``."""

    output: str
    valid: bool = True
    submitted: bool = False


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
