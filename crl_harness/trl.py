"""Train on any ``CRL/*`` env with TRL's ``GRPOTrainer`` in its environment mode.

Holds:
- ``CRLEnvironment``: one episode of a CRL env as TRL's environment protocol asks for it:
  ``reset`` returns the prompt (the env's instructions, the task and the first observation),
  the single tool ``act`` plays one action and returns what the agent sees next, and
  ``get_reward`` is the episode's return.
- ``environment_factory``: the zero-argument factory ``GRPOTrainer(environment_factory=...)``
  takes, for one env id (checked at once).
- ``tasks_dataset``: a ``datasets.Dataset`` with one row per level (a ``seed`` column), so that
  the ``num_generations`` rollouts of a GRPO group play the same level.
- ``environment_factories`` and ``mixture_dataset``: one trainer on a mixture of envs, through
  TRL's multi-environment mode (a dict of factories keyed by env id, and a dataset whose
  ``environment`` column names each row's env).
- ``TOOL_FORMAT``: what the system prompt says about answering (a call of ``act``, in place of
  the rollout engine's ``<think>...</think><answer>ACTION</answer>``).

It lives in ``crl_harness`` because it plays episodes with the rollout engine's own
``LiveEpisode`` (the prompt rendering, ``clean_text``, the episode's bookkeeping), not a copy;
``crl_wrappers`` holds Gymnasium wrappers only. It needs the ``trl`` extra
(``pip install 'crl-gym[trl]'``), and the model's chat template must support tool calling
(Qwen2.5/3, Llama 3.1, ...), which TRL checks when the trainer is built. TRL marks its
environment mode experimental, so the extra asks for TRL 1.x only.

Example (the env side, as TRL drives it):
    >>> env = environment_factory("CRL/Sokoban-v0")()
    >>> prompt = env.reset(seed=0)
    >>> "call the act tool" in prompt
    True
    >>> env.act("dance").startswith("Invalid action")
    True
    >>> env.trajectory.invalid_actions, env.get_reward()
    (1, 0.0)
"""

from __future__ import annotations

import importlib.util
import itertools
import numbers
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import gymnasium as gym

import crl_envs  # noqa: F401  (registers the CRL ids)
from crl_envs.errors import missing_extra
from crl_harness.experience.entries import clean_text
from crl_harness.rollout import EpisodeSpec, LiveEpisode, Trajectory, Turn, make_env

__all__ = ["CRLEnvironment", "environment_factory", "environment_factories", "tasks_dataset",
           "mixture_dataset", "TOOL_FORMAT"]

TOOL_FORMAT = (
    "To act, call the act tool with ONE ACTION written as the rules above say; it returns what "
    "you observe next. Keep acting until the episode is over."
)


def _require_trl() -> None:
    """Raise the one-line install hint where TRL is not installed."""
    if importlib.util.find_spec("trl") is None:
        raise ModuleNotFoundError(
            missing_extra(ModuleNotFoundError("No module named 'trl'", name="trl")), name="trl")


def _check_env_id(env_id: str) -> None:
    if env_id not in gym.registry:
        known = ", ".join(sorted(i for i in gym.registry if i.startswith("CRL/")))
        raise gym.error.UnregisteredEnv(f"No env {env_id!r}; the CRL ids are: {known}.")


class CRLEnvironment:
    """One CRL env behind TRL's environment protocol (``reset``, tools, ``get_reward``).

    TRL builds a pool of these through ``environment_factory`` and, for each rollout, calls
    ``reset(**row)`` with the dataset row (its ``seed``, and ``options`` when the row has them),
    exposes every public method other than ``reset`` and ``get_reward`` to the model as a tool
    (here only ``act``) and scores the finished rollout with ``get_reward``.

    A row without a ``seed`` plays a level drawn from this instance's own random stream, so a
    GRPO group's rollouts then play different levels: give the trainer ``tasks_dataset(...)``.
    An action the env does not understand is the env's invalid action (a no-op step with
    ``action_valid=False``, the observation says what is allowed), never an exception.

    Example:
        >>> env = CRLEnvironment("CRL/Sokoban-v0")
        >>> env.reset(seed=3) == env.reset(seed=3)
        True
        >>> env.trajectory.seed, env.trajectory.steps
        (3, 0)
    """

    def __init__(self, env_id: str, **make_kwargs: Any) -> None:
        _check_env_id(env_id)
        self.env_id = env_id
        self._env = make_env(env_id, **make_kwargs)
        self._episode: LiveEpisode | None = None
        self._seeds = random.Random()

    @property
    def trajectory(self) -> Trajectory | None:
        """The episode so far (turns, return, ``won``, ``score``); None before the first reset."""
        return self._episode.trajectory if self._episode is not None else None

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None,
              **row: Any) -> str:
        """Start an episode; returns the prompt TRL appends to the row's last user message."""
        if seed is None:
            seed = self._seeds.randrange(2**31)
        # An Arrow column of dicts fills the keys a row lacks with None: those are dropped.
        options = {k: v for k, v in (options or {}).items() if v is not None} or None
        spec = EpisodeSpec(self.env_id, int(seed), options=options)
        self._episode = LiveEpisode(spec, self._env, history=None, answer_format=TOOL_FORMAT)
        self._episode.reset(with_experience_option=False)
        return f"{self._episode.conversation.system}\n\n{self._episode.observation}"

    def act(self, action: str) -> str:
        """Take one action in the environment.

        Args:
            action: One action, written as the rules say (for example a direction).

        Returns:
            What the agent observes after the action, and whether the episode is over.
        """
        episode = self._episode
        if episode is None:
            raise RuntimeError("CRLEnvironment.act() before reset(): call reset() first.")
        if episode.done:
            return "The episode is over; do not act again."
        action = clean_text(str(action)).strip()
        turn = Turn(prompt_token_ids=[], token_ids=[], logprobs=[], text=action, action=action,
                    observation=episode.observation)
        episode.trajectory.turns.append(turn)
        episode.trajectory.steps += 1
        episode.step(turn)
        if not episode.done:
            return episode.observation
        outcome = "won" if episode.trajectory.won else "not won"
        return f"{episode.observation}\n\nThe episode is over ({outcome}); do not act again."

    def get_reward(self) -> float:
        """The episode's return so far (the sum of the env's rewards)."""
        return self._episode.trajectory.reward if self._episode is not None else 0.0


def environment_factory(env_id: str, **make_kwargs: Any) -> Callable[[], CRLEnvironment]:
    """The ``environment_factory`` for ``GRPOTrainer``: each call makes a ``CRLEnvironment`` of
    ``env_id`` (``make_kwargs`` go to ``gymnasium.make``). A bad id fails here, at once.

    Example:
        >>> environment_factory("CRL/Nope-v0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        gymnasium.error.UnregisteredEnv: No env 'CRL/Nope-v0'; the CRL ids are: ...
    """
    _require_trl()
    _check_env_id(env_id)

    def make() -> CRLEnvironment:
        return CRLEnvironment(env_id, **make_kwargs)

    return make


def environment_factories(env_ids: Iterable[str], **make_kwargs: Any
                          ) -> dict[str, Callable[[], CRLEnvironment]]:
    """The dict ``environment_factory`` of TRL's multi-environment mode: env id -> the factory of
    ``environment_factory(env_id, **make_kwargs)``. Give the trainer ``mixture_dataset(...)``,
    whose ``environment`` column names each row's env (any iterable of ids does, e.g. the
    mapping given to ``mixture_dataset``). Every id is checked here, at once.

    Example:
        >>> sorted(environment_factories(["CRL/Sokoban-v0", "CRL/Sokoban-v0"]))
        ['CRL/Sokoban-v0']
    """
    ids = _checked_env_ids(env_ids, "environment_factories")
    return {env_id: environment_factory(env_id, **make_kwargs) for env_id in ids}


def tasks_dataset(seeds: int | Iterable[int], options: Sequence[dict[str, Any]] | None = None):
    """A ``datasets.Dataset`` for ``GRPOTrainer(train_dataset=...)``: one row per level, with an
    empty user message as the prompt (``CRLEnvironment.reset`` fills it) and the level's
    ``seed`` (``seeds``: the seeds, or a count: ``range(seeds)``); ``options``, one dict per
    seed, go to the env's ``reset`` (e.g. ``{"task_id": 7}`` for WebShop or ALFWorld).
    A count is at least 1 and every seed a whole number in [0, 2^63): a string (``"12"``, whose
    characters would be the seeds), a float (``2.7``) or a negative seed is refused in one line.

    Example:
        >>> tasks_dataset(3)[1]
        {'prompt': [{'role': 'user', 'content': ''}], 'seed': 1}
    """
    _require_trl()
    from datasets import Dataset

    seeds = _checked_seeds(seeds)
    columns = _level_columns(seeds)
    if options is not None:
        if len(options) != len(seeds):
            raise ValueError(f"tasks_dataset: {len(options)} options for {len(seeds)} seeds.")
        columns["options"] = [dict(o) for o in options]
    return Dataset.from_dict(columns)


def mixture_dataset(levels: Mapping[str, int | Iterable[int]]):
    """A ``datasets.Dataset`` for one ``GRPOTrainer`` on a mixture of envs: for each env id, its
    levels (the seeds, or a count: ``range(count)``, as ``tasks_dataset`` takes them), each row
    with an ``environment`` column naming its env, which TRL's multi-environment mode routes to
    that env's factory (``environment_factories(levels)``). The envs' rows alternate (one of
    each env in turn while each lasts), so a mixture stays mixed even unshuffled.

    Example:
        >>> rows = mixture_dataset({"CRL/Sokoban-v0": [7, 8], "CRL/MiniHackRoom-v0": 1})
        >>> [(row["environment"], row["seed"]) for row in rows]
        [('CRL/Sokoban-v0', 7), ('CRL/MiniHackRoom-v0', 0), ('CRL/Sokoban-v0', 8)]
    """
    if not isinstance(levels, Mapping):
        raise TypeError("mixture_dataset: levels must map env ids to seeds (or counts), got "
                        f"{type(levels).__name__} {str(levels)[:40]!r}.")
    _checked_env_ids(levels, "mixture_dataset")
    per_env = [[(env_id, seed) for seed in _checked_seeds(seeds, f"mixture_dataset[{env_id!r}]")]
               for env_id, seeds in levels.items()]
    _require_trl()
    from datasets import Dataset

    rows = [row for turn in itertools.zip_longest(*per_env) for row in turn if row is not None]
    columns = _level_columns([seed for _, seed in rows])
    columns["environment"] = [env_id for env_id, _ in rows]
    return Dataset.from_dict(columns)


def _level_columns(seeds: list[int]) -> dict[str, list[Any]]:
    """The dataset columns of one row per level: the empty prompt ``reset`` fills, the seed."""
    return {"prompt": [[{"role": "user", "content": ""}] for _ in seeds], "seed": seeds}


def _checked_env_ids(env_ids: Iterable[str], caller: str) -> list[str]:
    """``env_ids`` as a list of registered ids, or the one-line error of what is wrong with them
    (a single id as a string would otherwise be iterated as its characters)."""
    if isinstance(env_ids, (str, bytes)) or not isinstance(env_ids, Iterable):
        raise TypeError(f"{caller}: give a list of env ids, got {type(env_ids).__name__} "
                        f"{str(env_ids)[:40]!r}.")
    ids = list(env_ids)
    if not ids:
        raise ValueError(f"{caller}: no env ids; give at least one.")
    for env_id in ids:
        if not isinstance(env_id, str):
            raise TypeError(f"{caller}: an env id must be a string, got {type(env_id).__name__} "
                            f"{str(env_id)[:40]!r}.")
        _check_env_id(env_id)
    return list(dict.fromkeys(ids))


def _checked_seeds(seeds: int | Iterable[int], caller: str = "tasks_dataset") -> list[int]:
    """``caller``'s seeds as a list, or the one-line error of what is wrong with them."""
    if isinstance(seeds, numbers.Integral) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"{caller}: a count of seeds must be >= 1, got {seeds}.")
        return list(range(int(seeds)))
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise TypeError(f"{caller}: seeds must be a count or a list of whole numbers, got "
                        f"{type(seeds).__name__} {str(seeds)[:40]!r}.")
    listed = list(seeds)
    if not listed:
        raise ValueError(f"{caller}: the list of seeds is empty; give at least one.")
    for seed in listed:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"{caller}: every seed must be a whole number, got "
                            f"{type(seed).__name__} {str(seed)[:40]!r}.")
        if not 0 <= seed < 2**63:
            raise ValueError(f"{caller}: seeds must be in [0, 2^63), got {seed}.")
    return [int(seed) for seed in listed]
