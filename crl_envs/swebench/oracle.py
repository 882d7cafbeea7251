"""``GoldPatchAgent``: the SWE oracle. It applies the task's gold patch through the agent's own
tools (one ``str_replace_editor`` call per hunk, ``create`` for new files), then submits.

If an edit is refused (a hunk whose text is not unique in its file, say), it falls back to
applying the whole patch with ``git apply`` through the ``bash`` tool.
"""

from __future__ import annotations

import shlex
from typing import Any

import gymnasium as gym

from crl_envs.swebench.tools import format_tool_call

__all__ = ["GoldPatchAgent", "patch_to_tool_calls"]

_HEREDOC_END = "CRL_GOLD_PATCH_EOF"


def patch_to_tool_calls(patch: str, repo_dir: str) -> list[str]:
    """Editor calls that make the changes of a unified diff (unidiff parses it).

    Each hunk becomes one ``str_replace`` of its old lines (context and removed) by its new
    lines; an added file becomes a ``create``; a removed file a ``bash`` ``rm``.
    """
    from unidiff import PatchSet

    calls = []
    for patched in PatchSet(patch):
        path = f"{repo_dir.rstrip('/')}/{patched.path}"
        if patched.is_removed_file:
            calls.append(format_tool_call("bash", command=f"rm -- {shlex.quote(path)}"))
            continue
        if patched.is_added_file:
            text = "".join(line.value for hunk in patched for line in hunk if line.is_added)
            calls.append(format_tool_call("str_replace_editor", command="create", path=path,
                                          file_text=text))
            continue
        for hunk in patched:
            old = "".join(line.value for line in hunk if line.is_context or line.is_removed)
            new = "".join(line.value for line in hunk if line.is_context or line.is_added)
            calls.append(format_tool_call("str_replace_editor", command="str_replace",
                                          path=path, old_str=old, new_str=new))
    return calls


class GoldPatchAgent:
    """Plays an SWE episode with the gold patch of the task the env has drawn.

    Example:
        >>> import warnings, gymnasium as gym, crl_envs
        >>> warnings.filterwarnings("ignore", message="LocalSandbox")
        >>> env = gym.make("CRL/SWEBenchToy-v0")
        >>> from crl_envs.oracles import play_episode
        >>> episode = play_episode(env, GoldPatchAgent(env), seed=0)
        >>> episode.reward, episode.info["resolved"]
        (1.0, True)
        >>> env.close()
    """

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self._plan: list[str] = []
        self._fell_back = False

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        swe = self.env.unwrapped
        self._patch = swe.instance["patch"]
        self._repo_dir = swe.sandbox.repo_dir
        self._plan = patch_to_tool_calls(self._patch, self._repo_dir)
        self._plan.append(format_tool_call("submit"))
        self._fell_back = False

    def act(self, observation: str, info: dict[str, Any]) -> str:
        if not info.get("action_valid", True) and not self._fell_back:
            # An edit was refused: undo everything and apply the patch as a whole.
            self._fell_back = True
            self._plan = [format_tool_call("submit")]
            patch = self._patch if self._patch.endswith("\n") else self._patch + "\n"
            return format_tool_call(
                "bash",
                command=(f"cd {shlex.quote(self._repo_dir)} && git checkout -q -- . && "
                         f"git clean -fdq && git apply - <<'{_HEREDOC_END}'\n{patch}{_HEREDOC_END}"),
            )
        return self._plan.pop(0) if self._plan else format_tool_call("submit")
