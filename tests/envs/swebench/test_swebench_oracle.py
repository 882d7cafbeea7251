"""GoldPatchAgent: a unified diff replayed through the agent's tools gives the same diff."""

from __future__ import annotations

import subprocess
import warnings
from types import SimpleNamespace

import pytest

from crl_envs.swebench.data import load_instances
from crl_envs.swebench.oracle import GoldPatchAgent, patch_to_tool_calls
from crl_envs.swebench.sandbox import LocalSandbox, UnisolatedSandboxWarning
from crl_envs.swebench.tools import Tools

pytest.importorskip("unidiff")

BASE = {
    "pkg/a.py": "def f():\n\treturn 1\n\n\ndef g():\n    return 2\n",
    "pkg/twice.py": "a\nb\nc\nd = 1\ne\nf\ng\n" * 3,
    "old.txt": "remove me\n",
}


def make_repo(root):
    for name, text in BASE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"],
                   cwd=root, check=True)


def gold_diff(root, edits: dict[str, str | None]) -> str:
    """Apply ``edits`` (None deletes), return the staged diff, and reset the repo."""
    for name, text in edits.items():
        if text is None:
            (root / name).unlink()
        else:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    diff = subprocess.run(["git", "diff", "--cached"], cwd=root, capture_output=True, text=True,
                          check=True).stdout
    subprocess.run(["git", "reset", "-q", "--hard"], cwd=root, check=True)
    return diff


def play(box, patch) -> tuple[str, int]:
    """Run GoldPatchAgent's plan through Tools until it submits; return the diff and the steps."""
    tools = Tools(box)
    env = SimpleNamespace(unwrapped=SimpleNamespace(instance={"patch": patch}, sandbox=box))
    agent = GoldPatchAgent(env)
    agent.reset("", {})
    info, steps = {"action_valid": True}, 0
    while True:
        result = tools.call(agent.act("", info))
        steps += 1
        if result.submitted:
            return box.diff(), steps
        info = {"action_valid": result.valid}


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "origin"
    root.mkdir()
    make_repo(root)
    return root


def sandbox(root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnisolatedSandboxWarning)
        return LocalSandbox(root)


def test_edits_new_and_removed_files_replay_exactly(repo):
    patch = gold_diff(repo, {"pkg/a.py": BASE["pkg/a.py"].replace("return 1", "return 10")
                             .replace("return 2", "return 20"),
                             "pkg/new.py": "NEW = True\n", "old.txt": None})
    box = sandbox(repo)
    diff, steps = play(box, patch)
    assert diff == patch and steps == 4  # one str_replace (one hunk), create, rm, submit
    assert "\treturn 10" in box.read_file(box.repo_dir + "/pkg/a.py")  # the tab is kept
    box.close()


def test_ambiguous_hunk_falls_back_to_git_apply(repo):
    block = "a\nb\nc\nd = 1\ne\nf\ng\n"  # 3 lines of context either side: the same 3 times
    patch = gold_diff(repo, {"pkg/twice.py": block + block.replace("d = 1", "d = 2") + block})
    calls = patch_to_tool_calls(patch, "/r")
    assert len(calls) == 1 and "str_replace" in calls[0]
    box = sandbox(repo)
    diff, steps = play(box, patch)
    assert diff == patch and steps == 3  # refused str_replace, bash git apply, submit
    box.close()


@pytest.mark.data
def test_every_verified_gold_patch_converts_to_tool_calls(data_dir):
    rows = load_instances("verified", data_dir=data_dir("swebench", "verified_test.parquet"))
    for row in rows:
        assert patch_to_tool_calls(row["patch"], "/testbed"), row["instance_id"]
