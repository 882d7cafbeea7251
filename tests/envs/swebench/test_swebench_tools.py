"""SWE tools over a real LocalSandbox: persistent bash, timeouts, output cut, editor, path refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from crl_envs.swebench.sandbox import OUTPUT_LIMIT, LocalSandbox, UnisolatedSandboxWarning, reaper
from crl_envs.swebench.tools import ToolCallError, Tools, format_tool_call, parse_tool_call


@pytest.fixture
def tools(tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("a = 1\nb = 2\na = 1\nc = 3\n")
    (source / ".hidden").write_text("secret\n")
    (tmp_path / "outside.txt").write_text("outside\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)  # shown once a process
        box = LocalSandbox(source)
    yield Tools(box, command_timeout=1.0)
    box.close()


def edit(tools, **parameters):
    return tools.call(format_tool_call("str_replace_editor", **parameters))


def bash(tools, command):
    return tools.call(format_tool_call("bash", command=command))


def mod_path(tools) -> str:
    return tools.sandbox.repo_dir + "/pkg/mod.py"


# ----------------------------------------------------------------------------- syntax
def test_parse_tool_call_keeps_values_verbatim():
    call = parse_tool_call("thinking...\n<function=str_replace_editor>\n<parameter=command>create"
                           "</parameter>\n<parameter=path>/r/x.py</parameter>\n<parameter=file_text>"
                           "\n  if a < b and c > d:\n\tpass\n\n</parameter>\n</function>")
    assert call.name == "str_replace_editor"
    assert call.parameters["file_text"] == "  if a < b and c > d:\n\tpass\n"
    assert parse_tool_call("<function=submit></function>").name == "submit"


@pytest.mark.parametrize("text, message", [
    ("ls", "no tool call"),
    ("<function=python>\n</function>", "unknown tool"),
    ("<function=bash>\n</function>", "needs the parameter"),
    ("<function=bash><parameter=command>ls</parameter><parameter=x>1</parameter></function>",
     "takes no parameter x"),
    ("<function=bash><parameter=command>ls</function>", "not closed"),
    ("<function=submit></function><function=submit></function>", "exactly one"),
])
def test_parse_tool_call_errors_say_what_is_wrong(text, message):
    with pytest.raises(ToolCallError, match=message):
        parse_tool_call(text)


# ----------------------------------------------------------------------------- bash
def test_bash_state_carries_over(tools):
    assert bash(tools, "cd pkg && export GREETING=hi && shout() { echo \"$1!\"; }").valid
    bash(tools, "count=41; names=(a 'b c'); alias hello='echo hello'; exit 4")
    result = bash(tools, "pwd; echo $GREETING; shout hey; echo $((count + 1)) ${names[1]}; hello")
    assert result.output == (f"{tools.sandbox.repo_dir}/pkg\nhi\nhey!\n42 b c\nhello\n"
                             "[exit code 0]")
    assert bash(tools, "env | grep -c '^count='").output.startswith("0\n")  # not exported


def test_bash_reports_exit_code_and_stderr(tools):
    result = bash(tools, "echo out; echo err >&2; exit 3")
    assert "out\n" in result.output and "err\n" in result.output
    assert result.output.endswith("[exit code 3]") and result.valid
    assert bash(tools, "true").output == "(no output)\n[exit code 0]"


def test_bash_stdin_is_closed(tools):
    result = bash(tools, "cat; echo done")  # an open stdin: cat waits for the 1 s timeout
    assert result.output.endswith("done\n[exit code 0]") and "timed out" not in result.output


def test_bash_timeout_kills_whole_process_group(tools, tmp_path):
    pid_file = tmp_path / "child.pid"
    start = time.monotonic()
    result = bash(tools, f"sleep 60 & echo $! > {pid_file}; echo started; sleep 60")
    assert time.monotonic() - start < 30  # a hang guard: the timeout is 1 s, the sleeps 60
    assert result.output.startswith("started\n") and "timed out after 1 seconds" in result.output
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child), "the background child survived the timeout"
    assert bash(tools, "echo alive").output == "alive\n[exit code 0]"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_long_output_is_cut_with_marker(tools):
    result = bash(tools, "python -c \"print('x' * 100000)\"")
    text, _, rest = result.output.partition("\n<output cut")
    assert text == "x" * OUTPUT_LIMIT
    assert rest.startswith(": showing the first 16,000 of") and result.output.endswith("[exit code 0]")


# ----------------------------------------------------------------------------- editor
def test_view_file_with_line_numbers_and_range(tools):
    result = edit(tools, command="view", path=mod_path(tools))
    assert "     1\ta = 1\n     2\tb = 2\n" in result.output
    result = edit(tools, command="view", path=mod_path(tools), view_range="[2, 3]")
    assert result.output.endswith("     2\tb = 2\n     3\ta = 1")
    assert not edit(tools, command="view", path=mod_path(tools), view_range="[9, 10]").valid


def test_view_directory_lists_two_levels_without_hidden(tools):
    result = edit(tools, command="view", path=tools.sandbox.repo_dir)
    repo = tools.sandbox.repo_dir
    assert f"{repo}/pkg\n" in result.output and f"{repo}/pkg/mod.py" in result.output
    assert ".hidden" not in result.output and ".git" not in result.output


def test_create_refuses_existing_file(tools):
    new = tools.sandbox.repo_dir + "/pkg/new.py"
    assert edit(tools, command="create", path=new, file_text="x = 1\n").valid
    assert Path(new).read_text() == "x = 1\n"
    result = edit(tools, command="create", path=new, file_text="y = 2\n")
    assert not result.valid and "already exists" in result.output
    assert Path(new).read_text() == "x = 1\n"


def test_str_replace_needs_exactly_one_match(tools):
    before = Path(mod_path(tools)).read_text()
    none = edit(tools, command="str_replace", path=mod_path(tools), old_str="z = 9", new_str="")
    assert not none.valid and "did not appear verbatim" in none.output
    two = edit(tools, command="str_replace", path=mod_path(tools), old_str="a = 1", new_str="a = 0")
    assert not two.valid and "Multiple occurrences" in two.output and "[1, 3]" in two.output
    assert Path(mod_path(tools)).read_text() == before
    one = edit(tools, command="str_replace", path=mod_path(tools), old_str="b = 2", new_str="b = 20")
    assert one.valid and "     2\tb = 20" in one.output
    assert Path(mod_path(tools)).read_text() == "a = 1\nb = 20\na = 1\nc = 3\n"


def test_insert_and_undo_edit(tools):
    path = mod_path(tools)
    original = Path(path).read_text()
    assert edit(tools, command="insert", path=path, insert_line="0", new_str="# top").valid
    assert edit(tools, command="str_replace", path=path, old_str="c = 3", new_str="c = 4").valid
    assert Path(path).read_text() == "# top\na = 1\nb = 2\na = 1\nc = 4\n"
    bad = edit(tools, command="insert", path=path, insert_line="99", new_str="x")
    assert not bad.valid and "[0, 6]" in bad.output
    assert edit(tools, command="undo_edit", path=path).valid
    assert Path(path).read_text() == "# top\na = 1\nb = 2\na = 1\nc = 3\n"
    assert edit(tools, command="undo_edit", path=path).valid
    assert Path(path).read_text() == original
    again = edit(tools, command="undo_edit", path=path)
    assert not again.valid and "No edit history" in again.output


def test_undo_of_create_removes_the_file(tools):
    new = tools.sandbox.repo_dir + "/made.txt"
    edit(tools, command="create", path=new, file_text="")
    assert os.path.exists(new)
    assert edit(tools, command="undo_edit", path=new).valid and not os.path.exists(new)


def test_editor_refuses_paths_outside_checkout(tools, tmp_path):
    repo = tools.sandbox.repo_dir
    os.symlink(tmp_path / "outside.txt", Path(repo) / "link.txt")
    os.symlink(tmp_path, Path(repo) / "linkdir")
    for path in ["/etc/passwd", f"{repo}/../../outside.txt", f"{repo}/link.txt",
                 f"{repo}/linkdir/outside.txt", f"{repo}/linkdir/new.txt"]:
        for parameters in [dict(command="view"), dict(command="create", file_text="pwned\n"),
                           dict(command="str_replace", old_str="outside", new_str="pwned")]:
            result = edit(tools, path=path, **parameters)
            assert not result.valid and result.output.startswith("Refused:"), (path, parameters)
    assert (tmp_path / "outside.txt").read_text() == "outside\n"
    assert not (tmp_path / "new.txt").exists()


def test_relative_path_is_refused_with_a_hint(tools):
    result = edit(tools, command="view", path="pkg/mod.py")
    assert not result.valid and f"Maybe you meant {tools.sandbox.repo_dir}/pkg/mod.py" in result.output


def test_unknown_editor_command_and_missing_parameter(tools):
    assert "Unknown str_replace_editor command" in edit(tools, command="delete",
                                                        path=mod_path(tools)).output
    assert "needs the parameter(s) file_text" in edit(tools, command="create",
                                                      path=mod_path(tools)).output


def test_diff_includes_new_files(tools):
    edit(tools, command="create", path=tools.sandbox.repo_dir + "/added.py", file_text="z = 1\n")
    edit(tools, command="str_replace", path=mod_path(tools), old_str="c = 3", new_str="c = 30")
    diff = tools.sandbox.diff()
    assert "+++ b/added.py" in diff and "+c = 30" in diff


def test_sandbox_close_kills_background_jobs(tmp_path):
    (tmp_path / "src").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        box = LocalSandbox(tmp_path / "src")
    box.run(f"sleep 60 & echo $! > {tmp_path}/bg.pid", timeout=5)
    pid = int((tmp_path / "bg.pid").read_text())
    assert _alive(pid)
    box.close()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not _alive(pid) and not os.path.exists(box.repo_dir)


def test_reaper_reports_the_exit_status_and_finds_descendants():
    # The program each LocalSandbox command runs under, run as the sandbox runs it.
    status_r, status_w = os.pipe()
    try:
        done = subprocess.run([sys.executable, "-I", "-S", reaper.__file__, str(status_w), "-1",
                               "sh", "-c", "exit 3"], pass_fds=[status_w], timeout=30)
        os.close(status_w)
        assert done.returncode == 0 and os.read(status_r, 100) == b"3"
    finally:
        os.close(status_r)
    # And its functions, imported: a grandchild is found through its parent.
    child = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                             text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert {child.pid, grandchild} <= set(reaper.descendants())
    finally:
        os.kill(grandchild, 9)
        child.wait(timeout=10)
        child.stdout.close()


def test_diff_is_whole_and_independent_of_the_shell_cwd(tools):
    big = "".join(f"line_{index} = {index}\n" for index in range(3000))  # ~50k characters
    edit(tools, command="create", path=tools.sandbox.repo_dir + "/big.py", file_text=big)
    bash(tools, "cd /tmp")
    diff = tools.sandbox.diff()
    assert len(diff) > 3 * OUTPUT_LIMIT and "output cut" not in diff and "+line_2999 = 2999" in diff


def test_crlf_line_endings_survive_an_edit(tools):
    path = tools.sandbox.repo_dir + "/win.txt"
    Path(path).write_bytes(b"one\r\ntwo\r\n")
    assert edit(tools, command="str_replace", path=path, old_str="two", new_str="2").valid
    assert Path(path).read_bytes() == b"one\r\n2\r\n"


def test_background_writer_does_not_hold_the_command(tools, tmp_path):
    result = bash(tools, f"echo ok; (while true; do echo spam; done) & echo $! > {tmp_path}/w.pid")
    assert "ok" in result.output and "timed out" not in result.output  # held: the 1 s timeout
    os.kill(int((tmp_path / "w.pid").read_text()), 9)


def test_nul_bytes_and_oversized_commands_are_invalid_not_errors(tools):
    result = bash(tools, "echo a\x00b")
    assert not result.valid and "NUL" in result.output
    result = bash(tools, "echo " + "x" * 150_000)
    assert not result.valid and "the limit is 100,000" in result.output
    result = edit(tools, command="view", path="/tmp/\x00")
    assert not result.valid


def test_diff_includes_changes_the_agent_committed(tools):
    edit(tools, command="str_replace", path=mod_path(tools), old_str="c = 3", new_str="c = 33")
    bash(tools, "git add -A && git -c user.name=a -c user.email=a@a commit -qm mine")
    edit(tools, command="str_replace", path=mod_path(tools), old_str="b = 2", new_str="b = 22")
    diff = tools.sandbox.diff()
    assert "+c = 33" in diff and "+b = 22" in diff


def test_huge_arguments_are_not_echoed_whole(tools):
    result = edit(tools, command="str_replace", path=mod_path(tools), old_str="q" * 150_000,
                  new_str="")
    assert not result.valid and len(result.output) < 2_000 and "150,000 characters" in result.output
    result = edit(tools, command="view", path="/" + "p" * 300_000)
    assert not result.valid and len(result.output) < OUTPUT_LIMIT + 1_000


def test_commands_do_not_inherit_secrets(tools, monkeypatch):
    monkeypatch.setenv("CRL_TEST_SECRET_TOKEN", "s3cret")
    assert "s3cret" not in bash(tools, "env").output


def test_edit_keeps_the_file_mode(tools):
    script = Path(tools.sandbox.repo_dir) / "run.sh"
    script.write_text("echo one\n")
    script.chmod(0o755)
    assert edit(tools, command="str_replace", path=str(script), old_str="one", new_str="two").valid
    assert script.stat().st_mode & 0o777 == 0o755


def test_view_of_a_long_file_is_cut_with_a_hint(tools):
    path = Path(tools.sandbox.repo_dir) / "long.py"
    path.write_text("".join(f"value_{index} = {index}\n" for index in range(5000)))
    result = edit(tools, command="view", path=str(path))
    assert "<output cut: showing the first 16,000 of" in result.output
    assert result.output.endswith("Use view_range to see the lines after the cut.")
    tail = edit(tools, command="view", path=str(path), view_range="[4999, -1]")
    assert tail.output.endswith("  4999\tvalue_4998 = 4998\n  5000\tvalue_4999 = 4999\n  5001\t")


def test_an_unclosed_sandbox_is_cleaned_up_when_collected(tmp_path):
    import gc

    (tmp_path / "src").mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        box = LocalSandbox(tmp_path / "src")
    repo = box.repo_dir
    box.run(f"sleep 60 & echo $! > {tmp_path}/bg.pid", timeout=5)
    del box
    gc.collect()
    pid = int((tmp_path / "bg.pid").read_text())
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    assert not os.path.exists(repo) and not _alive(pid)


def test_shell_survives_hostile_commands(tools):
    assert bash(tools, "kill -9 $$").output.endswith("[exit code 137]")
    assert bash(tools, "trap 'echo trapped' EXIT; cd pkg; X=7").output == "(no output)\n[exit code 0]"
    assert bash(tools, "echo $X; basename $PWD").output == "7\npkg\n[exit code 0]"
    assert bash(tools, "set -e; false; echo never").output == "(no output)\n[exit code 1]"
    result = bash(tools, "unset PATH; echo gone")
    assert result.output == "gone\n[exit code 0]"  # the session is still saved without PATH
    assert "No such file" in bash(tools, "ls").output
