"""The text-environment contract shared by every CRL env.

Holds:
- ``TEXT_CHARSET``: the printable characters a CRL text space samples from.
- ``UnicodeText``: the observation and action space: any ``str`` of allowed length, sampled from
  ``TEXT_CHARSET``.
- ``create_shared_memory`` / ``read_from_shared_memory`` / ``write_to_shared_memory`` for
  ``UnicodeText`` (``SharedTexts``): the exact text through ``AsyncVectorEnv``'s shared memory
  (gymnasium's ``Text`` handlers read the buffer once, at construction: a megabyte of newlines).
- ``Transition``: what one env step produced, before the contract turns it into gymnasium's tuple.
- ``TextEnv``: the base class. A subclass implements ``_reset`` and ``_step`` and gets, for free,
  the text spaces, the info keys, invalid actions as no-op steps, the binary/score reward,
  type checks, ``ResetNeeded`` and ``render_mode="ansi"``.
- ``StepBudgetFromTimeLimit``: the registration wrapper that tells an env the ``TimeLimit`` it
  runs under (ALFWorld's -1 step, SWE-bench's forced submission).
"""

from __future__ import annotations

import copy
import multiprocessing as mp
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.spaces import Text
from gymnasium.vector.utils import (
    create_shared_memory,
    read_from_shared_memory,
    write_to_shared_memory,
)

__all__ = ["StepBudgetFromTimeLimit", "TEXT_CHARSET", "MAX_TEXT_LENGTH", "MAX_ACTION_LENGTH", "UnicodeText",
           "SharedTexts", "Transition",
           "TextEnv"]


def _printable_charset() -> str:
    """Every printable character of the Basic Multilingual Plane, plus newline and tab.

    The envs emit real-world text (product pages, tool output, source code), so samples are drawn
    from a Unicode-wide charset rather than gymnasium's default alphanumerics.
    """
    chars = ["\n", "\t"]
    for code in range(0x20, 0x10000):
        ch = chr(code)
        if ch.isprintable():
            chars.append(ch)
    return "".join(chars)


TEXT_CHARSET: str = _printable_charset()
MAX_TEXT_LENGTH: int = 1_000_000
# Actions a model writes are short; the env still accepts (and rejects) longer strings, but the
# space is what an agent should sample from (and check_env samples it).
MAX_ACTION_LENGTH: int = 10_000


class UnicodeText(Text):
    """A ``Text`` space that contains every ``str`` of allowed length, whatever its characters.

    The envs show real text exactly as the benchmark has it (a no-break space in a WebShop option,
    emoji in a product description, a control byte in tool output), so membership checks only
    the type and the length; ``sample`` still draws from the charset (printable characters).

    A deep copy shares the charset tables, which are read-only and large (gymnasium indexes every
    character), and copies only the sampling RNG: envs are copied often (tree search).

    Example:
        >>> space = UnicodeText(max_length=8, min_length=0, charset="abc")
        >>> space.contains("a\xa0\U0001f600"), space.contains("x" * 9), space.contains(b"ab")
        (True, False, False)
        >>> set(space.sample()) <= set("abc")
        True
    """

    def contains(self, x: Any) -> bool:
        """Any ``str`` whose length is within ``[min_length, max_length]``."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __eq__(self, other: Any) -> bool:
        # a plain Text with the same charset is a different (narrower) space
        return isinstance(other, UnicodeText) and super().__eq__(other)

    def __repr__(self) -> str:
        # Text's repr spells out the charset: tens of thousands of characters here
        return (f"UnicodeText({self.min_length}, {self.max_length}, samples from "
                f"{len(self.character_list)} characters)")

    def __deepcopy__(self, memo: dict[int, Any]) -> UnicodeText:
        clone = copy.copy(self)
        memo[id(self)] = clone
        clone._np_random = copy.deepcopy(self._np_random, memo)
        return clone


# AsyncVectorEnv (gym.make_vec(..., vectorization_mode="async")) passes observations through
# shared memory by default; gymnasium's Text handlers map characters through the charset and
# read back the padding. A UnicodeText slot holds the length, then the code points (int32).
@create_shared_memory.register(UnicodeText)
def _create_unicode_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = mp) -> Any:
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))


class SharedTexts(Sequence):
    """The texts in a UnicodeText shared memory, read when indexed: AsyncVectorEnv reads its
    observation buffer once, when it is built, and hands out that object after every step
    (a deep copy of it, by default: a tuple of the texts then).

    Example:
        >>> space = UnicodeText(max_length=4, min_length=0, charset="ab")
        >>> memory = create_shared_memory(space, n=2)
        >>> texts = read_from_shared_memory(space, memory, n=2)
        >>> write_to_shared_memory(space, 1, "ab\U0001f600", memory)
        >>> texts[1], copy.deepcopy(texts)
        ('ab\U0001f600', ('', 'ab\U0001f600'))
    """

    def __init__(self, data: np.ndarray) -> None:
        self._data = data  # (n, max_length + 1) int32: length, then code points

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self)[index]
        row = self._data[index]
        return row[1:1 + row[0]].tobytes().decode("utf-32-le", "surrogatepass")

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, (Sequence, np.ndarray)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # its contents change

    def __repr__(self) -> str:
        return f"SharedTexts({tuple(self)!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_from_shared_memory(space: UnicodeText, shared_memory: Any,
                                     n: int = 1) -> SharedTexts:
    data = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(n, space.max_length + 1)
    return SharedTexts(data)


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_to_shared_memory(space: UnicodeText, index: int, value: str,
                                    shared_memory: Any) -> None:
    codes = np.frombuffer(value.encode("utf-32-le", "surrogatepass"), dtype=np.int32)
    slot = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[
        index * (space.max_length + 1):(index + 1) * (space.max_length + 1)]
    slot[0] = len(codes)
    slot[1:1 + len(codes)] = codes


# Building a space over the 60k-character charset takes ~0.2 s (gymnasium indexes every
# character), so the spaces are built once and each env gets a shallow copy: the read-only
# charset tables are shared, the sampling RNG is the env's own.
_OBSERVATION_SPACE = UnicodeText(max_length=MAX_TEXT_LENGTH, min_length=0, charset=TEXT_CHARSET)
_ACTION_SPACE = UnicodeText(max_length=MAX_ACTION_LENGTH, min_length=0, charset=TEXT_CHARSET)


def _fresh_copy(space: UnicodeText) -> UnicodeText:
    clone = copy.copy(space)
    clone._np_random = None  # seeded lazily on first use, like a new space
    return clone


@dataclass
class Transition:
    """The outcome of one env step, in the env's own terms.

    ``valid=False`` means the action was not understood or not allowed: the env must not have
    changed its state, and ``observation`` says what was wrong and what is allowed.
    ``terminated`` is a real end of the task (won, lost, submitted); running out of steps is the
    TimeLimit wrapper's business, never the env's.
    """

    observation: str
    valid: bool = True
    won: bool = False
    terminated: bool = False
    score: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    penalty: float = 0.0
    """Added to a valid step's reward in every reward mode: the env's own shaping (MiniHack's
    ``penalty_step`` for a move that wastes a turn)."""


class TextEnv(gym.Env[str, str]):
    """Base class of every CRL env: string observations and actions under one contract.

    Subclasses set ``env_id`` and ``instructions`` and implement:

    - ``_reset(seed, options) -> str``: start an episode (use ``self.np_random`` for randomness,
      already seeded by ``reset``), return the first observation;
    - ``_step(action: str) -> Transition``: apply a string action;
    - ``task`` (property): the goal in words;
    - ``admissible_actions()``: the finite set of valid actions now, or ``None``.

    Reward: ``reward_mode="binary"`` gives ``success_reward`` on a win and ``failure_reward`` on a
    terminal loss (0 for most envs; ALFWorld's paper setting is -1), 0 otherwise;
    ``reward_mode="score"`` gives the benchmark score on terminal steps.

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/Sokoban-v0")
        >>> obs, info = env.reset(seed=0)
        >>> sorted(k for k in info if k in TextEnv.INFO_KEYS) == sorted(TextEnv.INFO_KEYS)
        True
        >>> obs, reward, terminated, truncated, info = env.step("jump")
        >>> info["action_valid"], reward
        (False, 0.0)
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    INFO_KEYS = ("task", "admissible_actions", "action_valid", "won", "score", "env_id")
    REWARD_MODES = ("binary", "score")

    env_id: str = "CRL/TextEnv-v0"
    instructions: str = ""
    success_reward: float = 1.0
    failure_reward: float = 0.0

    def __init__(self, render_mode: str | None = None, reward_mode: str = "binary") -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported; use None or 'ansi'."
            )
        if reward_mode not in self.REWARD_MODES:
            raise ValueError(f"reward_mode={reward_mode!r} is not one of {self.REWARD_MODES}.")
        self.render_mode = render_mode
        self.reward_mode = reward_mode
        self.observation_space = _fresh_copy(_OBSERVATION_SPACE)
        self.action_space = _fresh_copy(_ACTION_SPACE)
        self._last_observation = ""
        self._needs_reset = True
        self._won = False
        self._score = 0.0

    # ----------------------------------------------------------------- subclass interface
    def _reset(self, seed: int | None, options: dict[str, Any]) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement _reset")

    def _step(self, action: str) -> Transition:
        raise NotImplementedError(f"{type(self).__name__} must implement _step")

    @property
    def task(self) -> str:
        """The goal of the current episode, in words (also the retrieval query)."""
        return ""

    @property
    def retrieval_query(self) -> str | None:
        """A key of the current level for experience retrieval, where the levels share one
        ``task`` text (then ``info["retrieval_query"]``); ``None``: the task is the key."""
        return None

    def admissible_actions(self) -> list[str] | None:
        """The valid actions in the current state, where the set is finite; else ``None``."""
        return None

    # ----------------------------------------------------------------- gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        self._won = False
        self._score = 0.0
        observation = self._reset(seed, options)
        self._needs_reset = False
        return self._emit(observation, valid=True, extra={})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if not isinstance(action, str):
            raise TypeError(
                f"{self.env_id} actions are str, got {type(action).__name__}: {action!r:.80}"
            )
        if self._needs_reset:
            raise ResetNeeded("Cannot call env.step() before env.reset() (or after the episode ended).")
        result = self._step(action)
        if result.valid:
            self._won = self._won or result.won
            self._score = float(result.score)
        terminated = bool(result.valid and (result.terminated or result.won))
        if terminated:
            self._needs_reset = True
        reward = self._reward(result, terminated) + (result.penalty if result.valid else 0.0)
        observation, info = self._emit(result.observation, valid=result.valid, extra=result.info)
        return observation, reward, terminated, False, info

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_observation
        return None

    # ----------------------------------------------------------------- helpers
    def _reward(self, result: Transition, terminated: bool) -> float:
        if not terminated:
            return 0.0
        if self.reward_mode == "score":
            return float(result.score)
        return self.success_reward if result.won else self.failure_reward

    def _emit(self, observation: str, valid: bool, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._last_observation = observation
        info: dict[str, Any] = {
            "task": self.task,
            "admissible_actions": self.admissible_actions(),
            "action_valid": valid,
            "won": self._won,
            "score": self._score,
            "env_id": self.env_id,
            "instructions": self.instructions,
        }
        key = self.retrieval_query
        if key is not None:
            info["retrieval_query"] = key
        info.update(extra)
        return observation, info

    @staticmethod
    def invalid(message: str, allowed: list[str] | str | None = None) -> Transition:
        """An invalid-action transition whose observation says what was wrong and what is allowed."""
        text = f"Invalid action: {message}"
        if isinstance(allowed, list):
            text += "\nValid actions: " + ", ".join(allowed)
        elif allowed:
            text += "\n" + allowed
        return Transition(observation=text, valid=False)

    @staticmethod
    def normalize_action(action: str, max_chars: int = 200) -> str:
        """Lower-case, strip and collapse whitespace; long strings are cut (they are invalid anyway)."""
        return " ".join(action[:max_chars].split()).lower()


class StepBudgetFromTimeLimit(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Hand the limit of the ``TimeLimit`` under this wrapper to an env that acts on its last
    step (``follow_time_limit``): ALFWorld pays -1 there, SWE-bench submits and grades there.

    ``gym.make`` builds the env with a spec that has no ``max_episode_steps`` and puts
    ``TimeLimit`` outside it, so the env cannot know the limit it runs under. The registration
    lists this wrapper in ``additional_wrappers``, which ``gym.make`` applies after
    ``TimeLimit``: ``gym.make(ID, max_episode_steps=N)`` then acts on step N without a second
    argument. It changes no observation, reward or flag itself.

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/ALFWorld-v0", split="eval_out_of_distribution", max_episode_steps=5)
        >>> env.unwrapped.step_budget, env.spec.max_episode_steps
        (5, 5)
        >>> env.close()
    """

    def __init__(self, env: gym.Env[str, str]) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        # The TimeLimit wrapper's spec carries its max_episode_steps (None without one).
        limit = env.spec.max_episode_steps if env.spec is not None else None
        follow = getattr(env.unwrapped, "follow_time_limit", None)
        if follow is None:
            raise TypeError(f"StepBudgetFromTimeLimit wraps an env with follow_time_limit "
                            f"(ALFWorld, SWE-bench), not {env.unwrapped!r}.")
        follow(limit)
