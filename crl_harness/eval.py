"""Benchmark any agent on any CRL envs: success rates with confidence intervals, report files.

Holds:
- ``EnvSummary`` / ``summarize``: per-env success rate (Wilson 95% interval), mean steps of
  successes, invalid-action and format-failure rates, generated tokens, errors.
- ``PairedDifference`` / ``paired_difference``: two agents (or one before and after training) on
  the same levels, one episode each: the difference of their success rates with its 95% interval
  and McNemar's exact p; ``format_rate`` and ``format_paired`` print them with their intervals.
- ``wilson_interval``, ``expand_env_ids`` (ids, ``all`` or a mixture config name such as
  ``mix3``), ``parse_seeds``, ``episode_specs``.
- ``evaluate``: plays the episodes (scripted/human agents one step at a time in worker threads,
  model agents through the batched ``RolloutEngine``); each finished episode is appended at once
  to the ``crl-results/1`` attempts file (``crl_harness.results``) and its transcript to a JSON
  lines file (``transcript_record``), so a crash loses nothing already played.
- ``recorded_trajectory``: an attempt read back from a results file, for ``crl eval --resume``.
- ``write_report`` (JSON), ``plot_success`` (bar chart PNG), ``render_table`` (rich).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from crl_envs import ENV_IDS
from crl_envs.errors import UserFacingError, describe_error
from crl_harness.results import FORMAT, Attempt, append_attempt, tally
from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory, make_env

__all__ = ["EnvSummary", "summarize", "wilson_interval", "PairedDifference", "paired_difference",
           "format_rate", "format_paired", "expand_env_ids", "parse_seeds",
           "MAX_EPISODES", "MAX_SEED",
           "episode_specs", "evaluate", "write_report", "plot_success", "render_table",
           "transcript_record", "append_transcript", "RecordedTrajectory", "recorded_trajectory"]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial rate (sound at 0%, 100% and small n).

    Example:
        >>> [round(x, 3) for x in wilson_interval(20, 20)]
        [0.839, 1.0]
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def format_rate(successes: int, n: int) -> str:
    """A success rate with its 95% Wilson interval, in percent.

    Example:
        >>> format_rate(22, 64)
        '34.4% [23.9, 46.6] (22/64)'
    """
    low, high = wilson_interval(successes, n)
    rate = successes / n if n else 0.0
    return f"{100 * rate:.1f}% [{100 * low:.1f}, {100 * high:.1f}] ({successes}/{n})"


@dataclass(frozen=True)
class PairedDifference:
    """B's success rate minus A's over ``n`` pairs (the same level played once by each).

    Only the discordant pairs carry information: ``only_a`` (A won, B lost) and ``only_b``.
    With d = (only_b - only_a) / n, the 95% interval is d +- 1.96 * se, where
    se = sqrt(only_a + only_b - (only_b - only_a)^2 / n) / n (the Wald interval of a paired
    difference of proportions), and McNemar's exact p is the two-sided binomial test of only_b
    successes in only_a + only_b trials at 1/2.

    Example (22 against 20 wins on 64 levels, 6 won only after and 4 only before):
        >>> d = PairedDifference(n=64, a_wins=20, b_wins=22, only_a=4, only_b=6)
        >>> round(100 * d.difference, 1), [round(100 * x, 1) for x in d.interval]
        (3.1, [-6.5, 12.8])
        >>> round(d.mcnemar_p, 2)
        0.75
    """

    n: int
    a_wins: int
    b_wins: int
    only_a: int
    only_b: int

    @property
    def difference(self) -> float:
        return (self.only_b - self.only_a) / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        if not self.n:
            return -1.0, 1.0
        discordant = self.only_a + self.only_b
        se = math.sqrt(max(discordant - (self.only_b - self.only_a) ** 2 / self.n, 0.0)) / self.n
        return self.difference - 1.96 * se, self.difference + 1.96 * se

    @property
    def mcnemar_p(self) -> float:
        from scipy.stats import binomtest

        discordant = self.only_a + self.only_b
        return float(binomtest(self.only_b, discordant, 0.5).pvalue) if discordant else 1.0

    def to_dict(self) -> dict[str, float]:
        low, high = self.interval
        return {**asdict(self), "difference": self.difference, "ci_low": low, "ci_high": high,
                "mcnemar_p": self.mcnemar_p}


def paired_difference(a: Sequence[bool], b: Sequence[bool]) -> PairedDifference:
    """The ``PairedDifference`` of outcomes ``a[i]`` and ``b[i]`` on the same level ``i``.

    Example:
        >>> paired_difference([True, False, False], [True, True, False]).only_b
        1
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need the same levels: {len(a)} against {len(b)}")
    return PairedDifference(
        n=len(a), a_wins=sum(map(bool, a)), b_wins=sum(map(bool, b)),
        only_a=sum(bool(x) and not y for x, y in zip(a, b, strict=True)),
        only_b=sum(bool(y) and not x for x, y in zip(a, b, strict=True)))


def format_paired(d: PairedDifference, a: str = "A", b: str = "B") -> str:
    """A paired difference in points with its 95% interval and McNemar's p; ``a`` and ``b``
    name the two sides.

    Example:
        >>> format_paired(PairedDifference(n=64, a_wins=20, b_wins=22, only_a=4, only_b=6),
        ...               "before", "after")
        '+3.1 points [-6.5, +12.8], McNemar p 0.75 (64 pairs; after alone won 6, before alone 4)'
    """
    low, high = d.interval
    return (f"{100 * d.difference:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}], McNemar p "
            f"{d.mcnemar_p:.2g} ({d.n} pairs; {b} alone won {d.only_b}, {a} alone {d.only_a})")


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


def expand_env_ids(text: str) -> list[str]:
    """Comma-separated env ids, ``all``, or a config name (``mix3``) whose mixture is used.

    Example:
        >>> expand_env_ids("CRL/Sokoban-v0,CRL/MiniHackRoom-v0")
        ['CRL/Sokoban-v0', 'CRL/MiniHackRoom-v0']
    """
    ids: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part == "all":
            ids.extend(ENV_IDS)
        elif part in ENV_IDS:
            ids.append(part)
        else:
            from crl_harness.config import ConfigError, load_config

            try:
                ids.extend(entry.id for entry in load_config(part).tasks.envs)
            except ConfigError as err:
                raise UserFacingError(
                    f"'{part}' is neither an env id ({', '.join(ENV_IDS)}), 'all', nor a mixture "
                    f"config: {err}"
                ) from err
    if not ids:
        raise UserFacingError("--envs names no env; give ids, 'all' or a mixture such as mix3.")
    return list(dict.fromkeys(ids))


MAX_EPISODES = 100_000  # per env: more is a typo, and the seed list is held in memory
MAX_SEED = 2**63 - 1  # seeds reach numpy and torch generators, which take 64-bit values


def parse_seeds(text: str | None, episodes: int | None) -> list[int]:
    """Seeds from ``START`` (with ``episodes``), ``A-B`` (inclusive) or ``A,B,C``: at least one,
    at most ``MAX_EPISODES``, each in ``[0, MAX_SEED]``.

    Example:
        >>> parse_seeds("100", 3), parse_seeds("0-2", None), parse_seeds("5,7", None)
        ([100, 101, 102], [0, 1, 2], [5, 7])
    """
    if episodes is not None and not 1 <= episodes <= MAX_EPISODES:
        raise UserFacingError(f"--episodes must be between 1 and {MAX_EPISODES}, got {episodes}.")
    text = (text or "0").strip()
    try:
        seeds = _seed_sequence(text, episodes)
    except ValueError as err:  # a number past Python's 4300-digit conversion limit
        raise UserFacingError(f"Bad --seeds: {err}.") from err
    count = seeds.stop - seeds.start if isinstance(seeds, range) else len(seeds)  # no list yet
    if count > MAX_EPISODES:
        raise UserFacingError(f"--seeds {text[:40]} names {count} seeds; at most {MAX_EPISODES}.")
    if min(seeds) < 0 or max(seeds) > MAX_SEED:
        raise UserFacingError(f"--seeds {text[:40]}: seeds must lie in [0, {MAX_SEED}].")
    seeds = list(seeds)
    if episodes is not None and episodes != len(seeds):
        raise UserFacingError(f"--episodes {episodes} disagrees with the {len(seeds)} seeds of "
                              f"--seeds {text}; give one of them.")
    return seeds


def _seed_sequence(text: str, episodes: int | None) -> range | list[int]:
    """The seeds ``text`` names, as a range where it is one (a huge range costs nothing yet)."""
    if re.fullmatch(r"-?\d+", text):
        seeds = range(int(text), int(text) + (episodes if episodes is not None else 10))
    elif match := re.fullmatch(r"(-?\d+)-(-?\d+)", text):
        seeds = range(int(match[1]), int(match[2]) + 1)
        if seeds.stop <= seeds.start:  # not len(): a range past sys.maxsize has none
            raise UserFacingError(f"--seeds {text[:40]} is an empty range; write A-B with A <= B.")
    elif re.fullmatch(r"-?\d+(,\s*-?\d+)+,?", text):
        seeds = [int(s) for s in text.split(",") if s.strip()]
    else:
        raise UserFacingError(f"Bad --seeds {text[:40]!r}: use START, A-B or A,B,C.")
    return seeds


def episode_specs(env_ids: Sequence[str], seeds: Sequence[int],
                  use_experience: bool = False) -> list[EpisodeSpec]:
    """Every env id with every seed, interleaved so that envs share the batch from the start."""
    return [EpisodeSpec(env_id, seed, group_id=i, use_experience=use_experience)
            for i, seed in enumerate(seeds) for env_id in env_ids]


def evaluate(
    agent: str,
    specs: Sequence[EpisodeSpec],
    *,
    results_path: str | Path | None = None,
    transcripts_path: str | Path | None = None,
    backend: Any = None,
    retriever: Any = None,
    rollout: RolloutConfig | None = None,
    workers: int = 1,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Play ``specs`` with ``agent`` (``scripted``, ``human`` or a model spec) and return them.

    A model agent uses ``backend`` when given (else it is loaded from the spec) and the batched
    rollout engine; other agents play one episode per worker thread. Each finished episode is
    appended to ``results_path`` (a ``crl-results/1`` file; env failures are not attempts) and
    its transcript to ``transcripts_path`` (``transcript_record``, failures included) before
    ``on_done`` sees it.
    """
    lock = threading.Lock()

    def finished(traj: Trajectory) -> None:
        with lock:
            if results_path is not None and not traj.error:
                append_attempt(results_path, Attempt(
                    task_id=traj.task_id, won=traj.won, reward=traj.reward, score=traj.score,
                    steps=traj.steps, seed=traj.seed, env_id=traj.env_id, model=agent,
                    extra={"format_failures": traj.format_failures,
                           "invalid_actions": traj.invalid_actions,
                           "generated_tokens": traj.generated_tokens,
                           "truncated": traj.truncated}))
            if transcripts_path is not None:
                append_transcript(transcripts_path, transcript_record(traj, agent))
            if on_done is not None:
                on_done(traj)

    config = rollout or RolloutConfig()
    if agent in ("scripted", "human"):
        return _play_step_agents(agent, specs, retriever, workers, finished, config.env_kwargs)
    if backend is None:
        from crl_harness.models.registry import load_backend

        backend = load_backend(agent)
    config.workers = max(config.workers, workers)
    engine = RolloutEngine(backend, retriever=retriever, config=config)
    try:
        return engine.run(specs, on_done=finished)
    finally:
        engine.close()


def transcript_record(traj: Trajectory, agent: str) -> dict[str, Any]:
    """One episode as a JSON-ready record: who played what, the system prompt, and each turn's
    prompt (the observation), reply, action, reward and validity, then the outcome.

    Example:
        >>> from crl_harness.rollout import Turn
        >>> traj = Trajectory("CRL/Sokoban-v0", 3, won=True, steps=1, turns=[Turn(
        ...     [], [], [], text="up", action="up", observation="map", reward=1.0)])
        >>> record = transcript_record(traj, "scripted")
        >>> record["seed"], record["turns"][0]["reply"], record["turns"][0]["reward"]
        (3, 'up', 1.0)
    """
    return {
        "env_id": traj.env_id, "seed": traj.seed, "task_id": traj.task_id, "agent": agent,
        "task": traj.task, "use_experience": traj.use_experience,
        "experience_ids": traj.experience_ids, "system": traj.system,
        "turns": [{"observation": t.observation, "reply": t.text, "action": t.action,
                   "format_ok": t.format_ok, "action_valid": t.action_valid, "reward": t.reward,
                   "finish_reason": t.finish_reason, "generated_tokens": t.generated_tokens,
                   **({"ask": t.ask.query} if t.ask is not None else {})}
                  for t in traj.turns],
        "final_observation": traj.final_observation, "won": traj.won, "reward": traj.reward,
        "score": traj.score, "steps": traj.steps, "terminated": traj.terminated,
        "truncated": traj.truncated, "error": traj.error,
    }


def append_transcript(path: str | Path, record: dict[str, Any]) -> None:
    """Append one transcript record as a JSON line and flush it to disk."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@dataclass
class RecordedTrajectory(Trajectory):
    """A finished episode read back from a results file (no turns): what ``--resume`` counts."""

    recorded_tokens: int = 0

    @property
    def generated_tokens(self) -> int:
        return self.recorded_tokens


def recorded_trajectory(attempt: Attempt) -> RecordedTrajectory:
    """The summary fields of an episode an earlier run appended to the results file.

    Example:
        >>> traj = recorded_trajectory(Attempt("t", True, steps=5, seed=2, env_id="E",
        ...                                    extra={"generated_tokens": 40}))
        >>> traj.env_id, traj.seed, traj.won, traj.generated_tokens
        ('E', 2, True, 40)
    """
    extra = attempt.extra
    return RecordedTrajectory(
        attempt.env_id, attempt.seed if attempt.seed is not None else -1, task_id=attempt.task_id,
        won=attempt.won, reward=attempt.reward, score=attempt.score, steps=attempt.steps,
        format_failures=int(extra.get("format_failures", 0)),
        invalid_actions=int(extra.get("invalid_actions", 0)),
        truncated=bool(extra.get("truncated", False)),
        recorded_tokens=int(extra.get("generated_tokens", 0)))


def _play_step_agents(agent: str, specs: Sequence[EpisodeSpec], retriever: Any, workers: int,
                      finished: Callable[[Trajectory], None],
                      env_kwargs: dict[str, dict[str, Any]]) -> list[Trajectory]:
    from crl_harness.agents import make_agent, run_episode

    local = threading.local()  # each worker thread keeps one env per id (envs are not shared)

    def play(spec: EpisodeSpec) -> Trajectory:
        envs = local.__dict__.setdefault("envs", {})
        try:
            if spec.env_id not in envs:
                # the agents read the experience in info["instructions"]
                envs[spec.env_id] = make_env(spec.env_id, retriever, placement="instructions",
                                             **env_kwargs.get(spec.env_id, {}))
            env = envs[spec.env_id]
            traj = run_episode(env, make_agent(agent, spec.env_id, env), spec)
        except Exception as err:  # noqa: BLE001 - one env's failure (no Docker, no data) ends
            # only its own episodes; the report counts them as errors with the message.
            traj = Trajectory(spec.env_id, spec.seed, spec.group_id, spec.use_experience,
                              error=describe_error(err))
            failed = envs.pop(spec.env_id, None)
            if failed is not None:
                failed.close()
        finished(traj)
        return traj

    if agent == "human":
        workers = 1
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(play, specs))


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
