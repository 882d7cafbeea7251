"""The rollout engine's settings, and the one translation of a training config into them.

Holds ``RolloutConfig`` (with ``RolloutConfig.from_config``) and ``env_kwargs_by_id`` (a task
mixture's ``gym.make`` kwargs, one set per env id).

A setting that is also an actor or experience setting of a training run (``ActorConfig``,
``ExperienceConfig``) is declared there, with its doc and allowed values; here it only takes
that default and is checked by that declaration (``check_settings``), so the two cannot drift
and a hand-built engine (``crl eval``, a benchmark) passes the training run's checks. The engine's own settings (how many episodes at once, threads, seed,
env kwargs) are declared here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from crl_harness.config.fields import check_settings
from crl_harness.config.schema import ActorConfig, EnvEntry, ExperienceConfig, TrainConfig

__all__ = ["RolloutConfig", "env_kwargs_by_id"]


def env_kwargs_by_id(envs: Sequence[EnvEntry]) -> dict[str, dict[str, Any]]:
    """The ``gym.make`` kwargs of a mixture's envs by env id (``tasks.envs``); the engine keeps
    one set per id, so an id listed twice with different kwargs is refused.

    >>> from crl_harness.config import EnvEntry
    >>> env_kwargs_by_id([EnvEntry("CRL/Sokoban-v0", kwargs={"max_episode_steps": 4})])
    {'CRL/Sokoban-v0': {'max_episode_steps': 4}}
    """
    env_kwargs: dict[str, dict[str, Any]] = {}
    for entry in envs:
        if env_kwargs.setdefault(entry.id, dict(entry.kwargs)) != dict(entry.kwargs):
            raise ValueError(f"tasks.envs lists {entry.id} twice with different kwargs; the "
                             "rollout engine keeps one set of kwargs per env id.")
    return env_kwargs


@dataclass
class RolloutConfig:
    """Settings of the rollout engine; ``from_config`` gives a training run's.

    Example:
        >>> from crl_harness.config import load_config
        >>> cfg = load_config(None, ["actor.max_new_tokens=64", "experience.k=2"])
        >>> rollout = RolloutConfig.from_config(cfg)
        >>> rollout.max_new_tokens, rollout.temperature, rollout.experience_k
        (64, 0.99, 2)
        >>> RolloutConfig().max_new_tokens == ActorConfig().max_new_tokens
        True
    """

    max_new_tokens: int = ActorConfig.max_new_tokens
    """``actor.max_new_tokens``: cap on the tokens of one reply (a reply cut there is usually a
    format failure)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy); log-probs are taken under it. 1 here, the model's own
    distribution, where a training run samples at ``actor.temperature``."""
    top_p: float = ActorConfig.top_p
    """``actor.top_p``"""
    history: int | None = ActorConfig.history
    """``actor.history``"""
    format_penalty: float = ActorConfig.format_penalty
    """``actor.format_penalty`` (0 disables)"""
    max_live: int = 64
    """Episodes played at once (the generate batch)."""
    workers: int = 1
    """Threads for env resets and steps (envs whose steps wait on a process or C code); keep 1
    for ALFWorld, whose game loading is not thread-safe."""
    experience_k: int = ExperienceConfig.k
    """``experience.k``: bank entries retrieved per episode when experience is on."""
    seed: int | None = None
    """Base seed of the sampling; each generate call gets the next derived seed."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for gym.make, per env id."""
    actor_critic_gate: bool = ExperienceConfig.actor_critic_gate
    """``experience.actor_critic_gate``"""
    search_and_ask: bool = ExperienceConfig.search_and_ask
    """``experience.search_and_ask`` (the retriever then needs ``ask``)"""
    max_asks: int = ExperienceConfig.max_asks
    """``experience.max_asks``"""
    max_query_chars: int = ExperienceConfig.max_query_chars
    """``experience.max_query_chars``"""

    def __post_init__(self) -> None:
        check_settings(ActorConfig, "actor", {
            "max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "history": self.history, "format_penalty": self.format_penalty})
        check_settings(ExperienceConfig, "experience", {
            "k": self.experience_k, "max_asks": self.max_asks,
            "max_query_chars": self.max_query_chars})

    @classmethod
    def from_config(cls, cfg: TrainConfig, **overrides: Any) -> RolloutConfig:
        """A training run's rollout settings: the actor's sampling, the experience switches, a
        whole step's episodes at once, ``run.rollout_workers`` threads and its mixture's env
        kwargs; ``overrides`` replace any of them. The seed stays None: sampling draws from
        torch's global RNG, which checkpoints carry."""
        a, e = cfg.actor, cfg.experience
        settings: dict[str, Any] = dict(
            max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_p=a.top_p,
            history=a.history, format_penalty=a.format_penalty,
            max_live=cfg.tasks.groups_per_step * cfg.tasks.group_size,
            workers=cfg.run.rollout_workers,
            experience_k=e.k, seed=None, env_kwargs=env_kwargs_by_id(cfg.tasks.envs),
            actor_critic_gate=e.actor_critic_gate, search_and_ask=e.search_and_ask,
            max_asks=e.max_asks, max_query_chars=e.max_query_chars)
        settings.update(overrides)
        return cls(**settings)
