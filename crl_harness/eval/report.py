"""What an eval's episodes add up to, and the report, chart and table that show it.

Holds:
- ``EnvSummary`` / ``summarize``: per-env success rate (Wilson 95% interval), mean steps of
  successes, invalid-action and format-failure rates, generated tokens, errors;
- ``write_report`` (JSON), ``plot_success`` (bar chart PNG), ``render_table`` (rich).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crl_harness.eval.intervals import wilson_interval
from crl_harness.results import FORMAT, Attempt, tally
from crl_harness.rollout import Trajectory

__all__ = ["EnvSummary", "summarize", "write_report", "plot_success", "render_table"]


@dataclass
class EnvSummary:
    """What one env's episodes add up to."""

    env_id: str
    episodes: int
    successes: int
    success_rate: float
    ci_low: float
    ci_high: float
    mean_steps_success: float | None  # None when nothing succeeded
    invalid_action_rate: float  # invalid steps (format failures included) over all steps
    format_failure_rate: float  # replies outside the answer format over all steps
    mean_reward: float
    mean_score: float
    generated_tokens: int
    errors: int  # episodes the env itself failed (not counted as attempts)


def summarize(trajectories: Sequence[Trajectory]) -> list[EnvSummary]:
    """One ``EnvSummary`` per env id, in first-seen order; env failures are counted apart."""
    by_env: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        by_env.setdefault(traj.env_id, []).append(traj)
    summaries = []
    for env_id, trajs in by_env.items():
        played = [t for t in trajs if not t.error]
        wins = [t for t in played if t.won]
        steps = sum(t.steps for t in played)
        low, high = wilson_interval(len(wins), len(played))
        summaries.append(EnvSummary(
            env_id=env_id, episodes=len(played), successes=len(wins),
            success_rate=len(wins) / len(played) if played else 0.0, ci_low=low, ci_high=high,
            mean_steps_success=sum(t.steps for t in wins) / len(wins) if wins else None,
            invalid_action_rate=sum(t.invalid_actions for t in played) / steps if steps else 0.0,
            format_failure_rate=sum(t.format_failures for t in played) / steps if steps else 0.0,
            mean_reward=sum(t.reward for t in played) / len(played) if played else 0.0,
            mean_score=sum(t.score for t in played) / len(played) if played else 0.0,
            generated_tokens=sum(t.generated_tokens for t in played),
            errors=len(trajs) - len(played),
        ))
    return summaries


def write_report(path: str | Path, trajectories: Sequence[Trajectory],
                 meta: dict[str, Any]) -> dict[str, Any]:
    """Write the JSON report: settings, per-env summaries, per-task attempts, every episode."""
    summaries = summarize(trajectories)
    per_task: dict[str, dict[str, Any]] = {}
    for env_id in dict.fromkeys(t.env_id for t in trajectories):
        attempts = [Attempt(task_id=t.task_id, won=t.won) for t in trajectories
                    if t.env_id == env_id and not t.error]
        per_task[env_id] = {
            task_id: {"attempts": c.attempts, "successes": c.successes, "pass_rate": c.pass_rate}
            for task_id, c in tally(attempts).items()
        }
    report = {
        "meta": meta,
        "results_format": FORMAT,
        "envs": [asdict(s) for s in summaries],
        "tasks": per_task,
        "episodes": [
            {"env_id": t.env_id, "seed": t.seed, "task_id": t.task_id, "won": t.won,
             "reward": t.reward, "score": t.score, "steps": t.steps,
             "invalid_actions": t.invalid_actions, "format_failures": t.format_failures,
             "generated_tokens": t.generated_tokens, "truncated": t.truncated, "error": t.error}
            for t in trajectories
        ],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)
    return report


def plot_success(path: str | Path, summaries: Sequence[EnvSummary], title: str = "") -> None:
    """Bar chart of success rate per env with the 95% interval as error bars; an env none of
    whose episodes ran (every one an env error) gets no bar, and the word "error"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.env_id.removeprefix("CRL/") for s in summaries]
    rates = [100 * s.success_rate if s.episodes else 0.0 for s in summaries]
    errors = [[100 * (s.success_rate - s.ci_low) if s.episodes else 0.0 for s in summaries],
              [100 * (s.ci_high - s.success_rate) if s.episodes else 0.0 for s in summaries]]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 1), 3.6))
    ax.bar(names, rates, yerr=errors, capsize=4, color="#4878d0")
    for index, summary in enumerate(summaries):
        if not summary.episodes:
            ax.text(index, 2, "error", ha="center", va="bottom", color="#c0392b")
    ax.set_ylim(0, 105)
    ax.set_ylabel("success rate (%)")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_table(summaries: Sequence[EnvSummary], title: str = "") -> Any:
    """A rich ``Table`` with one row per env; an env none of whose episodes ran reads "error"
    (not a 0% success rate with a 0-100% interval)."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("env", "episodes", "success", "95% CI", "steps (wins)", "invalid",
                   "format fail", "tokens", "errors"):
        table.add_column(column, justify="left" if column == "env" else "right")
    for s in summaries:
        if not s.episodes:
            table.add_row(s.env_id, "0", "[red]error[/]", "-", "-", "-", "-", "-", str(s.errors))
            continue
        table.add_row(
            s.env_id, str(s.episodes), f"{100 * s.success_rate:.1f}%",
            f"{100 * s.ci_low:.1f}-{100 * s.ci_high:.1f}%",
            "-" if s.mean_steps_success is None else f"{s.mean_steps_success:.1f}",
            f"{100 * s.invalid_action_rate:.1f}%", f"{100 * s.format_failure_rate:.1f}%",
            str(s.generated_tokens), str(s.errors),
        )
    return table
