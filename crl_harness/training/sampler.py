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
    """Draws ``groups_per_step`` (env, seed) pairs per step; env by mixture weight, seed uniform.

    >>> from crl_harness.config import EnvEntry, TaskConfig
    >>> tasks = TaskConfig(envs=[EnvEntry("CRL/Sokoban-v0", 1.0), EnvEntry("CRL/WebShop-v0", 3.0)],
    ...                    groups_per_step=4, seed_count=100)
    >>> sampler = TaskSampler(tasks, run_seed=0)
    >>> sampler.sample(7) == sampler.sample(7)
    True
    >>> [d.group_id for d in sampler.sample(7)]
    ['s7-g0', 's7-g1', 's7-g2', 's7-g3']
    """

    def __init__(self, tasks: TaskConfig, run_seed: int) -> None:
        self.envs: list[EnvEntry] = list(tasks.envs)
        weights = np.array([e.weight for e in self.envs], dtype=np.float64)
        self.probabilities = weights / weights.sum()
        self.groups_per_step = tasks.groups_per_step
        self.seed_offset = tasks.seed_offset
        self.seed_count = tasks.seed_count
        self.run_seed = run_seed

    def sample(self, step: int) -> list[TaskDraw]:
        rng = np.random.default_rng([self.run_seed, step])
        env_indices = rng.choice(len(self.envs), size=self.groups_per_step, p=self.probabilities)
        seeds = self.seed_offset + rng.integers(0, self.seed_count, size=self.groups_per_step)
        return [
            TaskDraw(int(e), self.envs[int(e)].id, int(s), f"s{step}-g{i}")
            for i, (e, s) in enumerate(zip(env_indices, seeds, strict=True))
        ]
