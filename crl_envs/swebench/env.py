"""``SWEBenchEnv``: SWE-bench tasks as a text env (``CRL/SWEBench-v0``, ``CRL/SWEBenchToy-v0``).

The observation is first the issue and where the repository is, then the output of each tool
call. The episode ends at ``submit``, or at the step limit (50 in the paper) with the
repository's current diff submitted. Reward 1 iff swebench's report says the task is resolved.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

from crl_envs.base import TextEnv, Transition
from crl_envs.swebench.data import TOY_DIR, load_instances
from crl_envs.swebench.grading import GRADINGS, Grade, grade_patch
from crl_envs.swebench.sandbox import (
    ContainerLimits,
    DockerSandbox,
    LocalSandbox,
    Sandbox,
    SandboxError,
)
from crl_envs.swebench.tools import TOOL_CALL_SYNTAX, Tools

__all__ = ["SWEBenchEnv"]

SANDBOXES = ("docker", "local")

_INSTRUCTIONS = f"""\
You are a software engineer fixing an issue in a code repository. You work through tools; each
turn you call exactly one tool and then see its output. Explore the repository, reproduce the
issue, edit the source files to fix it (not the tests), check your fix, then submit.

{TOOL_CALL_SYNTAX}"""

_TASK_PROMPT = """\
<uploaded_files>
{repo_dir}
</uploaded_files>
I've uploaded a code repository in the directory {repo_dir}. Consider the following issue:

<issue>
{issue}
</issue>

Make the minimal changes to non-test files in {repo_dir} so that the issue is resolved. \
Hidden tests will check the fix, so leave the test files as they are. When you are done, \
call submit."""


class SWEBenchEnv(TextEnv):
    """SWE-bench instances behind the text-env contract, with SWE-agent's tools.

    Args:
        dataset: ``"verified"`` (SWE-bench Verified), ``"toy"``, or a rows file / hub id.
        sandbox: ``"docker"`` (the instance's image; needs a Docker daemon) or ``"local"``
            (a temporary checkout on this host; unisolated, opt-in).
        task_ids: restrict to these ids (a list, comma-separated ids, or a file, one id a line).
        data_dir: where the dataset lies (default: the resolver of ``crl_envs.data``).
        repos_dir: for ``sandbox="local"`` on real tasks, a folder of git clones named
            ``owner__name``.
        command_timeout: seconds before a bash command is killed.
        eval_timeout: seconds before the grading test run is killed.
        max_steps: the step at which the current diff is submitted and graded (50, the
            paper's); the spec's ``max_episode_steps``, when smaller, wins, so the submission
            happens at the step where TimeLimit truncates.
        grading: ``"hardened"`` (default) grades the diff without its changes to test files,
            test configuration and start-up hooks (``conftest.py``, ``pytest.ini``,
            ``setup.cfg``, ``tox.ini``, ``pyproject.toml``, ``sitecustomize.py``...), which
            would let a policy make every test pass; ``"swebench"`` grades it whole, as
            upstream's harness does (for numbers comparable with the leaderboard).
        container_limits: for ``sandbox="docker"``, what its containers may use (a
            ``ContainerLimits``; default: no network, 4 GB of memory, 1024 processes).

    Each step is one tool call (``instructions`` give the syntax). A malformed call, or one the
    tool refuses without changing anything (no match for ``str_replace``, ``create`` over a file,
    a path outside the checkout), is an invalid action; a bash command that fails is a valid
    one (it ran; the observation ends with its exit code).

    ``reset(options={"task_id": ...})`` picks a task; else ``seed`` k picks task k mod N (in
    the order of the dataset or of ``task_ids``), so seeds 0..N-1 visit every task once. ``info["task_id"]``
    is the task's ``instance_id`` (what results files and ``crl swe filter`` key on). The final
    ``info`` holds ``patch``, ``resolved``, ``fail_to_pass`` and ``pass_to_pass`` (pass
    fractions), ``report`` (swebench's), ``submitted_by`` (``"submit"`` or
    ``"step_limit"``), ``dropped_paths`` (files whose changes the hardened grading left out)
    and ``grading_note`` (what was left out and why; empty when nothing was). ``patch`` is the
    diff that was graded. After that final step, ``step`` raises ``ResetNeeded``.

    Example:
        >>> import warnings, gymnasium as gym, crl_envs
        >>> from crl_envs.swebench.tools import format_tool_call
        >>> warnings.filterwarnings("ignore", message="LocalSandbox")
        >>> env = gym.make("CRL/SWEBenchToy-v0")
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(format_tool_call("submit"))
        >>> reward, terminated, info["patch"], info["fail_to_pass"]
        (0.0, True, '', 0.0)
        >>> env.close()
    """

    def __init__(self, dataset: str = "verified", sandbox: str = "docker",
                 task_ids: str | os.PathLike | list[str] | None = None,
                 data_dir: str | os.PathLike | None = None,
                 repos_dir: str | os.PathLike | None = None,
                 command_timeout: float = 120.0, eval_timeout: float = 1800.0,
                 max_steps: int | None = 50, docker_client: Any = None,
                 render_mode: str | None = None, reward_mode: str = "binary",
                 grading: str = "hardened",
                 container_limits: ContainerLimits | None = None) -> None:
        super().__init__(render_mode=render_mode, reward_mode=reward_mode)
        if sandbox not in SANDBOXES:
            raise ValueError(f"sandbox={sandbox!r} is not one of {SANDBOXES}.")
        if grading not in GRADINGS:
            raise ValueError(f"grading={grading!r} is not one of {GRADINGS}.")
        self.grading = grading
        self.env_id = "CRL/SWEBenchToy-v0" if dataset == "toy" else "CRL/SWEBench-v0"
        self.instructions = _INSTRUCTIONS
        self.dataset = dataset
        self.sandbox_kind = sandbox
        self.repos_dir = Path(repos_dir) if repos_dir else None
        self.command_timeout = command_timeout
        self.eval_timeout = eval_timeout
        self.max_steps = max_steps
        self._time_limit: int | None = None  # set by StepBudgetFromTimeLimit
        self.instances = load_instances(dataset, data_dir, task_ids)
        if not self.instances:
            raise ValueError(f"No SWE tasks selected from {dataset!r}.")
        self._by_id = {row["instance_id"]: row for row in self.instances}
        self._docker_client = docker_client
        self.container_limits = container_limits
        self.instance: dict[str, Any] | None = None
        self.sandbox: Sandbox | None = None
        self.tools: Tools | None = None
        self._steps = 0
        # LocalSandbox checkouts go to the same place every episode: same seed, same observation.
        self._workroot: Path | None = None

    # ----------------------------------------------------------------- contract
    @property
    def task(self) -> str:
        return self.instance["problem_statement"] if self.instance else ""

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        observation, info = super().reset(seed=seed, options=options)
        info["task_id"] = self.instance["instance_id"]
        return observation, info

    def _reset(self, seed: int | None, options: dict[str, Any]) -> str:
        task_id = options.get("task_id")
        if task_id is not None and task_id not in self._by_id:
            raise KeyError(f"Unknown task_id {task_id!r} for {self.env_id}; "
                           f"{len(self._by_id)} tasks are loaded.")
        if task_id is None:
            # Seed k is task k mod N, so seeds 0..N-1 visit every task once (an eval's sweep).
            index = seed % len(self.instances) if seed is not None else \
                int(self.np_random.integers(len(self.instances)))
            task_id = self.instances[index]["instance_id"]
        self._close_sandbox()
        self.instance = self._by_id[task_id]
        self.sandbox = self._make_sandbox(self.instance)
        self.tools = Tools(self.sandbox, command_timeout=self.command_timeout)
        self._steps = 0
        return _TASK_PROMPT.format(repo_dir=self.sandbox.repo_dir,
                                   issue=self.instance["problem_statement"].strip())

    def follow_time_limit(self, max_episode_steps: int | None) -> None:
        """Take the ``TimeLimit``'s ``max_episode_steps`` (``StepBudgetFromTimeLimit`` of the
        registration), so the submission happens on the step that truncates."""
        self._time_limit = max_episode_steps

    def _step_limit(self) -> int | None:
        """The step of the forced submission: ``max_steps``, or the TimeLimit's if smaller."""
        limits = [limit for limit in (self.max_steps, self._time_limit) if limit is not None]
        return min(limits) if limits else None

    def _step(self, action: str) -> Transition:
        self._steps += 1
        result = self.tools.call(action)
        limit = self._step_limit()
        at_limit = limit is not None and self._steps >= limit
        if not (result.submitted or at_limit):
            return Transition(observation=result.output, valid=result.valid,
                              info={"task_id": self.instance["instance_id"]})
        # Graded once: whatever step() is called next, the episode is over (TimeLimit does not
        # stop a caller that steps on after truncation; the env must).
        self._needs_reset = True
        patch = self.sandbox.diff()
        grade = grade_patch(self.sandbox, self.instance, patch, timeout=self.eval_timeout,
                            grading=self.grading)
        submitted_by = "submit" if result.submitted else "step_limit"
        verdict = "resolved" if grade.resolved else "not resolved"
        prefix = "" if result.submitted else (
            f"{result.output}\n\nStep limit ({limit}) reached: the current diff was "
            "submitted.\n")
        note = f" {grade.note}" if grade.note else ""
        return Transition(
            observation=f"{prefix}Submitted. The issue is {verdict} "
                        f"(FAIL_TO_PASS {grade.fail_to_pass:.0%}, PASS_TO_PASS "
                        f"{grade.pass_to_pass:.0%}).{note}",
            # The forced submission at the step limit is graded even after a malformed call;
            # `action_valid` still reports the call itself.
            valid=True, won=grade.resolved, terminated=result.submitted,
            score=float(grade.resolved),
            info={**self._grade_info(grade), "submitted_by": submitted_by,
                  "action_valid": result.valid, "task_id": self.instance["instance_id"]},
        )

    @staticmethod
    def _grade_info(grade: Grade) -> dict[str, Any]:
        return {"patch": grade.patch, "resolved": grade.resolved,
                "fail_to_pass": grade.fail_to_pass, "pass_to_pass": grade.pass_to_pass,
                "report": grade.report, "dropped_paths": grade.dropped_paths,
                "grading_note": grade.note}

    # ----------------------------------------------------------------- sandboxes
    def _make_sandbox(self, instance: dict[str, Any]) -> Sandbox:
        if self.sandbox_kind == "docker":
            return DockerSandbox(instance, client=self._docker_client,
                                 limits=self.container_limits)
        if self._workroot is None:
            self._workroot = Path(tempfile.mkdtemp(prefix="crl-swe-env-"))
            self._remove_workroot = weakref.finalize(self, shutil.rmtree, self._workroot, True)
        workdir = self._workroot / "testbed"
        if self.dataset == "toy":
            sandbox = LocalSandbox(TOY_DIR / "repo", workdir=workdir)
        else:
            if self.repos_dir is None:
                raise SandboxError(
                    f"sandbox='local' on {instance['repo']} needs repos_dir=, a folder with a git "
                    f"clone of it named {instance['repo'].replace('/', '__')}; or use "
                    "sandbox='docker'."
                )
            clone = self.repos_dir / instance["repo"].replace("/", "__")
            if not (clone / ".git").exists():
                raise SandboxError(f"No git clone at {clone}: run `git clone "
                                   f"https://github.com/{instance['repo']} {clone}`.")
            sandbox = LocalSandbox(clone, base_commit=instance["base_commit"], workdir=workdir)
        head = sandbox.base_commit
        if head != instance["base_commit"]:
            sandbox.close()
            raise SandboxError(f"The checkout of {instance['instance_id']} is at {head}, not the "
                               f"task's base_commit {instance['base_commit']}: its files changed.")
        return sandbox

    def _close_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
        self.sandbox, self.tools = None, None

    def close(self) -> None:
        self._close_sandbox()
        if self._workroot is not None:
            self._remove_workroot()
            self._workroot = None
        super().close()
