"""Experience augmentation for any text env (README, "Experience").

Holds:
- ``ExperienceItem``, ``Retriever``: the small protocol the wrapper depends on
  (``retrieve(env_id, query, k)`` returning items with ``.id`` and ``.text``).
  ``crl_harness.experience.ExperienceManager`` is one.
- ``retrieval_query``: the query of a reset (the env's key of the level, else the task text).
- ``experience_block`` and ``with_experience``: the experience as the agent reads it, alone and
  after the instructions (one rendering: the wrapper's, and the harness's system prompts).
- ``ExperienceAugmentation``: retrieves at reset and puts the experience where a harness places
  it, with the entry ids a harness credits (the wrapper reports no outcome itself).

This module imports only gymnasium.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
from gymnasium.spaces import Text

__all__ = ["ExperienceItem", "Retriever", "ExperienceAugmentation", "DEFAULT_HEADER",
           "retrieval_query", "experience_block", "with_experience"]

DEFAULT_HEADER = "Distilled knowledge from earlier experience:"


@runtime_checkable
class ExperienceItem(Protocol):
    """One retrieved piece of experience."""

    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...


class Retriever(Protocol):
    """What ``ExperienceAugmentation`` needs from a bank."""

    def retrieve(self, env_id: str, query: str, k: int) -> Sequence[ExperienceItem]: ...


class ExperienceAugmentation(gym.Wrapper[str, str, str, str], gym.utils.RecordConstructorArgs):
    """Give each episode the experience retrieved for its task and first observation.

    At reset the query is the env's key of the level, ``info["retrieval_query"]`` (an env whose
    levels share one task text gives one, e.g. MiniHack: the start cell and what is in view),
    else ``info["task"]`` (the task text is the key of the level), else, for an env with neither,
    the first observation; the top-``k`` items go to
    ``info["experience"]`` (the text, "" when none), ``info["experience_ids"]`` and
    ``info["experience_texts"]`` (each item's text, in the order of the ids), and into the
    reset observation (``placement="observation"``) or ``info["instructions"]``
    (``placement="instructions"``, for a harness that builds the system prompt from it), under
    ``header`` (``experience_block``, ``with_experience``); ``placement="info"`` leaves both
    alone, for a harness that places ``info["experience"]`` itself.
    ``reset(options={"use_experience": False})`` runs an experience-free episode (the GRPO
    subgroup without experience). The wrapper reports no outcome: whoever plays the episode
    credits the entries of ``info["experience_ids"]`` (the harness's trainer does, for a step's
    episodes at once).

    The observation space is the env's: in the observation the block is cut to the room a
    ``Text`` space's ``max_length`` leaves, and kept as retrieved otherwise (the CRL envs' space
    accepts any character). Only where a space still rejects it (a foreign env whose ``Text``
    charset is narrow) do the characters outside that charset become U+FFFD (or ``?``, or are
    dropped, whichever the charset allows); ``info["experience"]`` always keeps the text as
    retrieved.

    Example:
        >>> import gymnasium as gym, crl_envs
        >>> class OneTip:
        ...     id, text = "tip-1", "Push boxes only onto targets."
        >>> class Tips:
        ...     def retrieve(self, env_id, query, k):
        ...         return [OneTip()]
        >>> env = ExperienceAugmentation(gym.make("CRL/Sokoban-v0"), Tips())
        >>> obs, info = env.reset(seed=0)
        >>> info["experience_ids"], obs.startswith(DEFAULT_HEADER)
        (['tip-1'], True)
        >>> obs, info = env.reset(seed=0, options={"use_experience": False})
        >>> info["experience_ids"], info["experience"]
        ([], '')
    """

    PLACEMENTS = ("observation", "instructions", "info")

    def __init__(self, env: gym.Env[str, str], retriever: Retriever, k: int = 1,
                 placement: str = "observation", header: str = DEFAULT_HEADER,
                 env_id: str | None = None) -> None:
        if placement not in self.PLACEMENTS:
            raise ValueError(f"placement={placement!r} is not one of {self.PLACEMENTS}.")
        if not callable(getattr(retriever, "retrieve", None)):
            raise TypeError("retriever must have retrieve(env_id, query, k).")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}.")
        # The retriever is shared (a live bank), so it is recorded as is, not deep-copied.
        gym.utils.RecordConstructorArgs.__init__(self, _disable_deepcopy=True, retriever=retriever,
                                                 k=k, placement=placement, header=header,
                                                 env_id=env_id)
        gym.Wrapper.__init__(self, env)
        self.retriever = retriever
        self.k = k
        self.placement = placement
        self.header = header
        self.env_id = env_id

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        options = dict(options or {})
        use_experience = bool(options.pop("use_experience", True))
        observation, info = self.env.reset(seed=seed, options=options or None)
        items: Sequence[ExperienceItem] = []
        if use_experience and self.k:
            env_id = self.env_id or info.get("env_id") or self.env.spec.id
            items = self.retriever.retrieve(env_id, retrieval_query(observation, info), self.k)
        text = "\n".join(f"- {item.text}" for item in items)
        info["experience"] = text
        info["experience_ids"] = [str(item.id) for item in items]
        info["experience_texts"] = [item.text for item in items]
        if text and self.placement == "observation":
            observation = _prepend_within(self.observation_space,
                                          experience_block(text, self.header), observation)
        elif text and self.placement == "instructions":
            info["instructions"] = with_experience(info.get("instructions") or "", text,
                                                   self.header)
        return observation, info


def retrieval_query(observation: str, info: dict[str, Any]) -> str:
    """What a reset retrieves experience with: ``info["retrieval_query"]``, else
    ``info["task"]``, else the first observation.

    >>> retrieval_query("You see a room.", {"task": "Reach the stairs.", "retrieval_query": "start x=1, y=2"})
    'start x=1, y=2'
    >>> retrieval_query("You see a room.", {"task": "Reach the stairs."})
    'Reach the stairs.'
    """
    return info.get("retrieval_query") or info.get("task") or observation


def experience_block(text: str, header: str = DEFAULT_HEADER) -> str:
    """The experience as the agent reads it: ``header``, then the retrieved ``text``.

    >>> experience_block("- Push boxes only onto targets.")
    'Distilled knowledge from earlier experience:\\n- Push boxes only onto targets.'
    """
    return f"{header}\n{text}"


def with_experience(instructions: str, text: str, header: str = DEFAULT_HEADER) -> str:
    """``instructions`` followed by the experience block (``experience_block``), a blank line
    between; the instructions alone when ``text`` is empty.

    >>> print(with_experience("Push every box onto a target.", "- Never into a corner."))
    Push every box onto a target.
    <BLANKLINE>
    Distilled knowledge from earlier experience:
    - Never into a corner.
    >>> with_experience("Push every box onto a target.", "")
    'Push every box onto a target.'
    """
    if not text:
        return instructions
    block = experience_block(text, header)
    return f"{instructions}\n\n{block}" if instructions else block


def _prepend_within(space: gym.Space, block: str, observation: str, separator: str = "\n\n") -> str:
    """``block + separator + observation``, with the block cut to stay in ``space`` when it is a
    ``Text`` space (other spaces are not the wrapper's to judge), and its characters mapped only
    if the space still rejects them; with no room left the observation comes alone."""
    if not isinstance(space, Text):
        return f"{block}{separator}{observation}"
    room = space.max_length - len(observation) - len(separator)
    if room <= 0:
        return observation
    prefix = block[:room] + separator
    if space.contains(prefix + observation):
        return prefix + observation
    charset = space.character_set
    substitute = next((c for c in ("\ufffd", "?") if c in charset), "")
    return "".join(c if c in charset else substitute for c in prefix) + observation
