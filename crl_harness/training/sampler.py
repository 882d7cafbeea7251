"""``TaskSampler``: the task seeds of a training step, drawn from a weighted env mixture.

Two schedules (``tasks.schedule``):

- ``uniform``: each group's env by mixture weight, its seed uniform over the env's levels, the
  seeds of one step distinct where the pool allows (no level played by two groups of a step);
- ``revisit``: levels recur the way the paper's training set does (each task seed visited
  several times over a run): step 1 plays ``groups_per_step`` new levels, every later step
  ``new_per_step`` new ones and revisits the rest from the levels the previous step played for
  the first time. New levels come from a permutation of the pool, without replacement until it
  is spent. A revisited level is one whose lesson the bank may hold; ``TaskDraw.revisit`` says
  which groups those are, so that guided - free can be measured where experience can act.

The draw of step ``s`` depends only on ``(run_seed, s)`` (the revisit schedule replays steps
1..s to know what was new), so a resumed run draws exactly what the uninterrupted run would have
drawn, with no sampler state to checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from crl_harness.config import EnvEntry, TaskConfig

__all__ = ["TaskDraw", "TaskSampler"]


@dataclass(frozen=True)
class TaskDraw:
    """One group of a step: which env (index into the mixture), which seed, the group id, and
    whether an earlier step played this level already (``revisit``)."""

    env_index: int
    env_id: str
    seed: int
    group_id: str
    revisit: bool = False


class TaskSampler:
    """Draws ``groups_per_step`` (env, seed) pairs per step by ``tasks.schedule``; env by
    mixture weight, seeds from ``tasks.seeds`` when the config lists them, else from the range
    ``seed_offset`` + ``seed_count``.

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
    >>> recurring = TaskConfig(groups_per_step=4, seeds=list(range(32)), schedule="revisit")
    >>> s = TaskSampler(recurring, 0)
    >>> [d.revisit for d in s.sample(1)], [d.revisit for d in s.sample(2)]
    ([False, False, False, False], [False, False, True, True])
    >>> {d.seed for d in s.sample(2) if d.revisit} <= {d.seed for d in s.sample(1)}
    True
    """

    def __init__(self, tasks: TaskConfig, run_seed: int) -> None:
        self.envs: list[EnvEntry] = list(tasks.envs)
        weights = np.array([e.weight for e in self.envs], dtype=np.float64)
        self.probabilities = weights / weights.sum()
        self.groups_per_step = tasks.groups_per_step
        self.seeds = tasks.training_seeds()
        self.run_seed = run_seed
        self.schedule = tasks.schedule
        self.new_per_step = tasks.new_levels_per_step()
        self._history: list[list[TaskDraw]] = []  # the revisit schedule's steps 1.. so far
        self._permutations: dict[int, np.ndarray] = {}
        self._new_drawn: dict[int, int] = {}  # new levels drawn so far, per env
        self._played: set[tuple[int, int]] = set()  # (env, seed) played so far
        self._drawn_new: list[list[TaskDraw]] = []  # each step's new draws (a later walk of
        # the pool draws a level again: still that step's new one, revisited the step after)

    def sample(self, step: int) -> list[TaskDraw]:
        if self.schedule == "revisit":
            return self._revisit(step)
        return self._uniform(step)

    # ---------------------------------------------------------------- uniform
    def _uniform(self, step: int) -> list[TaskDraw]:
        rng = np.random.default_rng([self.run_seed, step])
        env_indices = rng.choice(len(self.envs), size=self.groups_per_step, p=self.probabilities)
        seeds: list[int] = [0] * self.groups_per_step
        for env in set(env_indices.tolist()):
            slots = [i for i, e in enumerate(env_indices) if e == env]
            for slot, seed in zip(slots, self._distinct(rng, len(slots)), strict=True):
                seeds[slot] = seed
        return [TaskDraw(int(e), self.envs[int(e)].id, int(s), f"s{step}-g{i}")
                for i, (e, s) in enumerate(zip(env_indices, seeds, strict=True))]

    def _distinct(self, rng: np.random.Generator, n: int) -> list[int]:
        """``n`` seeds of the pool, distinct while the pool has that many (a huge range is
        drawn with replacement: a repeat there is as rare as it is harmless)."""
        size = len(self.seeds)
        if n <= size <= 100_000:
            return [self.seeds[int(i)] for i in rng.choice(size, size=n, replace=False)]
        return [self.seeds[int(i)] for i in rng.integers(0, size, size=n)]

    # ---------------------------------------------------------------- revisit
    def _revisit(self, step: int) -> list[TaskDraw]:
        if step < 1:
            raise ValueError(f"the revisit schedule's steps count from 1, got {step}.")
        while len(self._history) < step:  # steps 1..step, in order, once each
            self._history.append(self._revisit_step(len(self._history) + 1))
        return list(self._history[step - 1])

    def _revisit_step(self, step: int) -> list[TaskDraw]:
        firsts = self._drawn_new[-1] if self._drawn_new else []  # the step before's new levels
        n_revisit = min(self.groups_per_step - self.new_per_step, len(firsts))
        n_new = self.groups_per_step - n_revisit
        rng = np.random.default_rng([self.run_seed, step])
        draws = []
        for i, env in enumerate(rng.choice(len(self.envs), size=n_new,
                                           p=self.probabilities).tolist()):
            seed = self._next_new(env, self._new_drawn.get(env, 0))
            self._new_drawn[env] = self._new_drawn.get(env, 0) + 1
            draws.append(TaskDraw(env, self.envs[env].id, seed, f"s{step}-g{i}",
                                  revisit=(env, seed) in self._played))
            self._played.add((env, seed))
        self._drawn_new.append(list(draws))
        for j, old in enumerate(firsts[:n_revisit]):
            draws.append(TaskDraw(old.env_index, old.env_id, old.seed,
                                  f"s{step}-g{n_new + j}", revisit=True))
        return draws

    def _next_new(self, env: int, index: int) -> int:
        """The ``index``-th new level of ``env``: a fixed permutation of the pool (per run and
        env), walked in order; once it is spent, the walk starts again."""
        size = len(self.seeds)
        if size > 100_000:  # a range too large to permute: a hash-like draw per index
            rng = np.random.default_rng([self.run_seed, env, index, 7])
            return self.seeds[int(rng.integers(0, size))]
        order = self._permutation(env)
        return self.seeds[int(order[index % size])]

    def _permutation(self, env: int) -> Sequence[int]:
        if env not in self._permutations:
            self._permutations[env] = np.random.default_rng(
                [self.run_seed, env, 7]).permutation(len(self.seeds))
        return self._permutations[env]

