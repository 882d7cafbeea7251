"""The rollout engine's settings, and the one way to build them from a training config.

Holds ``RolloutConfig`` (built by ``RolloutConfig.from_config``), the section settings it reads
(``SAMPLING``, ``EXPERIENCE_USE``) and ``env_kwargs_by_id`` (a task mixture's ``gym.make``
kwargs, one set per env id).

A setting that is also an actor or experience setting of a training run is not declared here:
the engine holds the run's ``ActorConfig`` and ``ExperienceConfig`` sections themselves and
checks what it reads by their declarations (``check_settings``), so the two cannot drift and an
engine built for ``crl eval`` or a benchmark passes the training run's checks. The engine's own
settings (how many episodes at once, threads, seed, env kwargs) are declared here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from crl_harness.config.fields import check_settings
from crl_harness.config.schema import ActorConfig, EnvEntry, ExperienceConfig, TrainConfig

__all__ = ["RolloutConfig", "SAMPLING", "EXPERIENCE_USE", "env_kwargs_by_id"]


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
    """Settings of the rollout engine: the run's ``actor`` and ``experience`` sections, of which
    it reads ``SAMPLING`` and ``EXPERIENCE_USE`` (declared, documented and bounded there, and
    checked here by those declarations: ``check_settings``), and the engine's own (episodes at
    once, threads, seed, env kwargs). ``from_config`` builds it, for a training run or bare.

    Example:
        >>> from crl_harness.config import load_config
        >>> cfg = load_config(None, ["actor.max_new_tokens=64", "experience.k=2"])
        >>> rollout = RolloutConfig.from_config(cfg, seed=3)
        >>> rollout.actor.max_new_tokens, rollout.actor.temperature, rollout.experience.k
        (64, 0.99, 2)
        >>> bare = RolloutConfig.from_config(None, max_new_tokens=8, k=2)
        >>> bare.actor.max_new_tokens, bare.actor.temperature, bare.experience.k, bare.max_live
        (8, 1.0, 2, 64)
    """

    actor: ActorConfig = field(default_factory=lambda: ActorConfig(temperature=1.0))
    """The actor's section: how a reply is sampled (``SAMPLING``). A bare engine's samples at
    temperature 1, the model's own distribution; a training run's at ``actor.temperature``."""
    experience: ExperienceConfig = field(default_factory=ExperienceConfig)
    """The experience section: how a guided episode uses the bank (``EXPERIENCE_USE``)."""
    max_live: int = 64
    """Episodes played at once (the generate batch)."""
    workers: int = 1
    """Threads for env resets and steps (envs whose steps wait on a process or C code); keep 1
    for ALFWorld, whose game loading is not thread-safe."""
    seed: int | None = None
    """Base seed of the sampling; each generate call gets the next derived seed."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for gym.make, per env id."""

    def __post_init__(self) -> None:
        check_settings(ActorConfig, "actor",
                       {name: getattr(self.actor, name) for name in SAMPLING})
        check_settings(ExperienceConfig, "experience",
                       {name: getattr(self.experience, name) for name in EXPERIENCE_USE})

    def replace(self, **settings: Any) -> RolloutConfig:
        """A copy with ``settings`` replaced, each by its field's name: the engine's own, one of
        the actor's ``SAMPLING`` or of the experience's ``EXPERIENCE_USE`` (the sections are
        copied, never changed); another name raises ``TypeError``."""
        by_section: dict[str, dict[str, Any]] = {"actor": {}, "experience": {}, "own": {}}
        for name, value in settings.items():
            section = ("actor" if name in SAMPLING else "experience" if name in EXPERIENCE_USE
                       else "own" if name in _OWN else None)
            if section is None:
                raise TypeError(f"Unknown rollout setting {name!r}; give one of "
                                f"{', '.join((*_OWN, *SAMPLING, *EXPERIENCE_USE))}.")
            by_section[section][name] = value
        return dataclasses.replace(
            self, actor=dataclasses.replace(self.actor, **by_section["actor"]),
            experience=dataclasses.replace(self.experience, **by_section["experience"]),
            **by_section["own"])

    @classmethod
    def from_config(cls, cfg: TrainConfig | None, **settings: Any) -> RolloutConfig:
        """The rollout settings of a training run ``cfg``: its actor and experience sections, a
        whole step's episodes at once, ``run.rollout_workers`` threads and its mixture's env
        kwargs; None: a bare engine's (the defaults above). ``settings`` replace any of them
        (``replace``). The seed stays None unless given: a run's sampling draws from torch's
        global RNG, which checkpoints carry."""
        if cfg is None:
            return cls().replace(**settings)
        return cls(actor=cfg.actor, experience=cfg.experience,
                   max_live=cfg.tasks.groups_per_step * cfg.tasks.group_size,
                   workers=cfg.run.rollout_workers,
                   env_kwargs=env_kwargs_by_id(cfg.tasks.envs)).replace(**settings)


SAMPLING = ("max_new_tokens", "temperature", "top_p", "history", "format_penalty")
"""The ``actor`` settings the engine reads: how it samples a reply and what a reply that breaks
the answer format costs."""
EXPERIENCE_USE = ("k", "actor_critic_gate", "search_and_ask", "max_asks", "max_query_chars")
"""The ``experience`` settings the engine reads: entries retrieved per guided episode, the
actor-critic gate, search-and-ask and its bounds."""
_OWN = ("max_live", "workers", "seed", "env_kwargs")
