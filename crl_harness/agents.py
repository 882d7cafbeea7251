"""Agents that play one episode at a time: the model agent, the scripted oracles, a human.

Holds:
- ``Agent``: the step-at-a-time protocol (``crl_envs.oracles.Agent``, re-exported: the oracles
  follow it too).
- ``ModelAgent``: a model backend behind that protocol (one prompt per step, for ``crl play``;
  batched play over many episodes is ``crl_harness.rollout.RolloutEngine``).
- ``HumanAgent``: reads actions from the terminal.
- ``make_agent``: ``"scripted"`` / ``"human"`` / a model spec -> an agent for one env.
- ``run_episode``: plays one episode with any ``Agent`` and returns a ``Trajectory``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym

from crl_envs.oracles import Agent, Episode, make_oracle, play_episode
from crl_harness.models.base import ModelBackend
from crl_harness.prompting import Conversation, parse_answer, system_prompt
from crl_harness.rollout import (
    EpisodeSpec,
    RolloutConfig,
    Trajectory,
    Turn,
    task_id_of,
    transcript_of,
)

__all__ = ["Agent", "ModelAgent", "HumanAgent", "make_agent", "run_episode"]


class ModelAgent:
    """A model backend as a step-at-a-time agent.

    A reply outside the answer format is passed to the env as it is, so the env answers with
    its invalid-action message; ``last_reply`` and ``last_format_ok`` tell what happened.

    Example:
        >>> import tempfile, gymnasium as gym, crl_envs
        >>> from crl_harness.models import HFBackend
        >>> from crl_harness.models.tiny import build_tiny_model
        >>> agent = ModelAgent(HFBackend(build_tiny_model(tempfile.mkdtemp())),
        ...                    RolloutConfig.from_config(None, max_new_tokens=4, seed=0))
        >>> env = gym.make("CRL/Sokoban-v0", max_episode_steps=3)
        >>> traj = run_episode(env, agent, EpisodeSpec("CRL/Sokoban-v0", seed=0))
        >>> traj.steps, traj.won
        (3, False)
    """

    def __init__(self, backend: ModelBackend, config: RolloutConfig | None = None) -> None:
        self.backend = backend
        self.config = config or RolloutConfig()
        self.conversation = Conversation("")
        self.last_reply = ""
        self.last_format_ok = True
        self._calls = 0

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        task = info.get("task", "") or ""
        instructions = info.get("instructions", "") or ""
        experience = info.get("experience", "") or ""
        if experience in instructions or experience in observation:
            experience = ""  # the wrapper placed it there already: shown once
        self.conversation = Conversation(
            system_prompt(instructions, experience, task="" if task in observation else task),
            self.config.actor.history,
        )

    def act(self, observation: str, info: dict[str, Any]) -> str:
        cfg = self.config
        self.conversation.observe(observation)
        messages = self.conversation.messages(self.backend.max_context - cfg.actor.max_new_tokens,
                                              self.backend.count_tokens)
        seed = None if cfg.seed is None else cfg.seed + self._calls
        self._calls += 1
        [generation] = self.backend.generate([messages], max_new_tokens=cfg.actor.max_new_tokens,
                                             temperature=cfg.actor.temperature,
                                             top_p=cfg.actor.top_p, seed=seed)
        self.conversation.reply(generation.text)
        parsed = parse_answer(generation.text)
        self.last_reply, self.last_format_ok = generation.text, parsed.format_ok
        return parsed.action if parsed.action is not None else generation.text


class HumanAgent:
    """Reads each action from the terminal; ``?`` lists the admissible actions when known."""

    def __init__(self, read: Callable[[str], str] = input, write: Callable[[str], None] = print):
        self.read, self.write = read, write

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        if info.get("instructions"):
            self.write(info["instructions"])
        if info.get("task"):
            self.write(f"Task: {info['task']}")

    def act(self, observation: str, info: dict[str, Any]) -> str:
        self.write(observation)
        while True:
            action = self.read("action> ").strip()
            if action == "?":
                allowed = info.get("admissible_actions")
                self.write(", ".join(allowed) if allowed else "This env has no finite action list.")
                continue
            return action


def make_agent(spec: str, env_id: str, env: gym.Env, config: RolloutConfig | None = None) -> Agent:
    """``scripted`` (the env's oracle), ``human``, or a model spec such as ``hf:smollm2-135m``."""
    if spec == "scripted":
        return make_oracle(env_id, env)
    if spec == "human":
        return HumanAgent()
    from crl_harness.models.registry import load_backend

    return ModelAgent(load_backend(spec), config)


def run_episode(env: gym.Env, agent: Agent, spec: EpisodeSpec) -> Trajectory:
    """Play one episode of ``env`` with ``agent``; token fields stay empty for non-model agents."""
    traj = Trajectory.of(spec)

    def record(episode: Episode) -> None:
        action, info = episode.actions[-1], episode.info
        turn = Turn(prompt_token_ids=[], token_ids=[], logprobs=[], text=action, action=action,
                    observation=episode.observations[-2])
        if isinstance(agent, ModelAgent):
            turn.format_ok = agent.last_format_ok
            traj.format_failures += not agent.last_format_ok
        turn.reward, turn.action_valid = episode.reward, bool(info.get("action_valid", True))
        traj.turns.append(turn)
        traj.steps += 1
        traj.reward += episode.reward
        traj.invalid_actions += not turn.action_valid
        traj.won, traj.score = episode.won, float(info.get("score", 0.0))
        traj.terminated, traj.truncated = episode.terminated, episode.truncated

    episode = play_episode(env, agent, spec.seed, dict(spec.options or {}), after_step=record)
    reset_info = episode.infos[0]
    traj.task = reset_info.get("task", "") or ""
    traj.task_id = task_id_of(spec.env_id, spec.seed, reset_info)
    traj.experience_ids = list(reset_info.get("experience_ids", []))
    traj.retrieval_key = str(reset_info.get("retrieval_query") or "")
    traj.transcript = transcript_of(traj.task, traj.turns, traj.won, traj.score,
                                    level=traj.retrieval_key, env_id=traj.env_id)
    traj.final_observation = episode.observation
    return traj
