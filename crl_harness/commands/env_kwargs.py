"""``--env-kwargs`` of ``crl eval`` and ``crl play``: keyword arguments of ``gym.make`` from the
command line, bounded and typed, each mistake a one-line error."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from crl_envs.errors import UserFacingError

__all__ = ["MAX_ENV_KWARGS_CHARS", "parse_env_kwargs", "check_env_kwargs"]


MAX_ENV_KWARGS_CHARS = 4096
"""bound on the text of ``--env-kwargs`` (all its words together)"""


def parse_env_kwargs(items: Sequence[str] | None) -> dict[str, Any]:
    """``--env-kwargs``: ``KEY=VALUE`` words (typed, see ``_typed``) or one JSON object, at most
    4 KB in all, or a clear error.

    >>> parse_env_kwargs(["variant=dark", "max_episode_steps=6", 'reward_mode="score"'])
    {'variant': 'dark', 'max_episode_steps': 6, 'reward_mode': 'score'}
    >>> parse_env_kwargs(['{"variant": "dark"}'])
    {'variant': 'dark'}
    """
    if not items:
        return {}
    size = sum(len(item) + 1 for item in items) - 1
    if size > MAX_ENV_KWARGS_CHARS:
        raise UserFacingError(f"--env-kwargs is {size} characters; at most "
                              f"{MAX_ENV_KWARGS_CHARS}.")
    if len(items) == 1 and items[0].lstrip()[:1] in ("{", "["):
        return _json_object(items[0])
    kwargs: dict[str, Any] = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key.isidentifier():
            raise UserFacingError(f"--env-kwargs: {item[:80]!r} is not KEY=VALUE (e.g. "
                                  "variant=dark max_episode_steps=6) nor one JSON object.")
        if key in kwargs:
            raise UserFacingError(f"--env-kwargs: {key!r} is given twice.")
        kwargs[key] = _typed(value)
    return kwargs


def _typed(value: str) -> Any:
    """A ``KEY=VALUE`` value as JSON where it parses (numbers, true/false, null, lists, quoted
    strings), else the text itself, so that ``variant=dark`` needs no quotes."""
    try:
        return json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserFacingError(f"--env-kwargs is not valid JSON ({err}); e.g. "
                              '\'{"variant": "dark"}\' or variant=dark') from err
    except RecursionError as err:  # "[[[[..." within the size bound
        raise UserFacingError("--env-kwargs nests too deeply to be keyword arguments.") from err
    if not isinstance(kwargs, dict):
        raise UserFacingError(f"--env-kwargs must be a JSON object of keyword arguments, got "
                              f"{type(kwargs).__name__}.")
    return kwargs


def check_env_kwargs(env_ids: Sequence[str], kwargs: dict[str, Any]) -> None:
    """Every env takes ``kwargs`` (``crl_envs.check_make_kwargs``), before any model loads."""
    from crl_envs import check_make_kwargs

    for env_id in env_ids:
        try:
            check_make_kwargs(env_id, kwargs)
        except ValueError as err:
            raise UserFacingError(f"--env-kwargs: {str(err).rstrip('.')}.") from err
