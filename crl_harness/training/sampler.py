"""``TaskSampler``: the task seeds of a training step, drawn from a weighted env mixture.

The draw of step ``s`` depends only on ``(run_seed, s)``, so a resumed run draws exactly what the
uninterrupted run would have drawn, with no sampler state to checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from crl_harness.config import EnvEntry, TaskConfig

__all__ = ["TaskDraw", "TaskSampler"]


@dataclass(frozen=True)
class TaskDraw:
    """One group of a step: which env (index into the mixture), which seed, and the group id."""

    env_index: int
    env_id: str
    seed: int
    group_id: str


class TaskSampler:
    """Draws ``groups_per_step`` (env, seed) pairs per step; env by mixture weight, seed uniform
    over ``tasks.seeds`` when the config lists them, else over the range ``seed_offset`` +
    ``seed_count``.

    >>> from crl_harness.config import EnvEntry, TaskConfig
    >>> tasks = TaskConfig(envs=[EnvEntry("CRL/Sokoban-v0", 1.0), EnvEntry("CRL/WebShop-v0", 3.0)],
    ...                    groups_per_step=4, seed_count=100)
    >>> sampler = TaskSampler(tasks, run_seed=0)
    >>> sampler.sample(7) == sampler.sample(7)
    True
    >>> [d.group_id for d in sampler.sample(7)]
    ['s7-g0', 's7-g1', 's7-g2', 's7-g3']
    >>> pool = TaskConfig(envs=tasks.envs, groups_per_step=4, seeds=[5, 17, 40])
    >>> {d.seed for step in range(20) for d in TaskSampler(pool, 0).sample(step)} == {5, 17, 40}
    True
    """

    def __init__(self, tasks: TaskConfig, run_seed: int) -> None:
        self.envs: list[EnvEntry] = list(tasks.envs)
        weights = np.array([e.weight for e in self.envs], dtype=np.float64)
        self.probabilities = weights / weights.sum()
        self.groups_per_step = tasks.groups_per_step
        self.seeds = tasks.training_seeds()
        self.run_seed = run_seed

    def sample(self, step: int) -> list[TaskDraw]:
        rng = np.random.default_rng([self.run_seed, step])
        env_indices = rng.choice(len(self.envs), size=self.groups_per_step, p=self.probabilities)
        seeds = [self.seeds[i] for i in rng.integers(0, len(self.seeds), size=self.groups_per_step)]
        return [
            TaskDraw(int(e), self.envs[int(e)].id, int(s), f"s{step}-g{i}")
            for i, (e, s) in enumerate(zip(env_indices, seeds, strict=True))
        ]
