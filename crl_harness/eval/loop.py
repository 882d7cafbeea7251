"""The eval's run loop: play every episode and record each one as soon as it ends.

Holds ``evaluate``: scripted/human agents play one step at a time in worker threads, model agents
through the batched ``RolloutEngine``; each finished episode's transcript is appended at once to
a JSON lines file (``records.transcript_record``), then its attempt to the ``crl-results/1``
attempts file (``crl_harness.results``), so a crash loses nothing already played.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from crl_envs.errors import describe_error
from crl_harness.eval.records import append_transcript, transcript_record
from crl_harness.results import Attempt, append_attempt
from crl_harness.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, Trajectory, make_env

__all__ = ["evaluate"]


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
    appended to ``transcripts_path`` (``transcript_record``, failures included), then to
    ``results_path`` (a ``crl-results/1`` file; env failures are not attempts), before
    ``on_done`` sees it.
    """
    lock = threading.Lock()

    def finished(traj: Trajectory) -> None:
        with lock:
            # The transcript first: the attempt is what marks an episode played (see
            # crl_harness.eval.folder), so a kill between the two leaves an episode to replay.
            if transcripts_path is not None:
                append_transcript(transcripts_path, transcript_record(traj, agent))
            if results_path is not None and not traj.error:
                append_attempt(results_path, Attempt(
                    task_id=traj.task_id, won=traj.won, reward=traj.reward, score=traj.score,
                    steps=traj.steps, seed=traj.seed, env_id=traj.env_id, model=agent,
                    extra={"format_failures": traj.format_failures,
                           "invalid_actions": traj.invalid_actions,
                           "generated_tokens": traj.generated_tokens,
                           "truncated": traj.truncated}))
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
            traj = Trajectory.of(spec, error=describe_error(err))
            failed = envs.pop(spec.env_id, None)
            if failed is not None:
                failed.close()
        finished(traj)
        return traj

    if agent == "human":
        workers = 1
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(play, specs))
