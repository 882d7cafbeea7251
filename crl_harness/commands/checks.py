"""Checks of command-line values shared by the ``crl`` subcommands.

Holds ``check_range`` (a number within bounds), ``output_dir`` (a folder that can be created
and written) and ``check_agent`` (an agent spec's shape, before anything loads). Each failure is
one ``UserFacingError`` naming the flag, which ``crl`` prints as one line.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from crl_envs.errors import UserFacingError

__all__ = ["check_range", "output_dir", "check_agent", "AGENT_SPECS"]

AGENT_SPECS = "scripted | human | hf:NAME_OR_PATH | vllm:NAME_OR_PATH | openai:BASE_URL#MODEL"


def check_range(flag: str, value: float | None, low: float | None = None,
                high: float | None = None) -> None:
    """Raise unless ``low <= value <= high`` (a bound of None is open; a None value passes) and
    ``value`` is finite (argparse's ``float`` reads ``nan`` and ``inf``).

    >>> check_range("--workers", 2, low=1)
    >>> check_range("--workers", -3, low=1)
    Traceback (most recent call last):
    ...
    crl_envs.errors.UserFacingError: --workers must be >= 1, got -3.
    >>> check_range("--temperature", float("nan"), low=0.0)
    Traceback (most recent call last):
    ...
    crl_envs.errors.UserFacingError: --temperature must be a finite number, got nan.
    """
    if value is None:
        return
    if not math.isfinite(value):
        raise UserFacingError(f"{flag} must be a finite number, got {value}.")
    if low is not None and value < low:
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise UserFacingError(f"{flag} must be {bound}, got {value}.")
    if high is not None and value > high:
        bound = f"between {low} and {high}" if low is not None else f"<= {high}"
        raise UserFacingError(f"{flag} must be {bound}, got {value}.")


def output_dir(path: str | os.PathLike, flag: str) -> Path:
    """Create ``path`` (and its parents) and make sure files can be written in it."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserFacingError(f"{flag} {folder}: cannot create this folder "
                              f"({err.strerror or err}); pick another.") from err
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserFacingError(f"{flag} {folder}: this folder is not writable; pick another.")
    return folder


def check_agent(spec: str) -> None:
    """Raise unless ``spec`` has the shape of an agent spec (whether the model exists is the
    backend's to say when it loads).

    >>> check_agent("hf:smollm2-135m")
    >>> check_agent("hf:")
    Traceback (most recent call last):
    ...
    crl_envs.errors.UserFacingError: --agent 'hf:' names no model; use one of: scripted | human | hf:NAME_OR_PATH | vllm:NAME_OR_PATH | openai:BASE_URL#MODEL.
    """
    if spec in ("scripted", "human"):
        return
    kind, sep, target = spec.partition(":")
    if not sep or kind not in ("hf", "vllm", "openai"):
        raise UserFacingError(f"--agent {spec[:80]!r} is not an agent; use one of: {AGENT_SPECS}.")
    if not target.strip():
        raise UserFacingError(f"--agent {spec!r} names no model; use one of: {AGENT_SPECS}.")
    if kind == "openai" and not target.partition("#")[2].strip():
        raise UserFacingError(f"--agent {spec[:80]!r}: openai needs BASE_URL#MODEL.")
    if kind == "openai":
        from crl_harness.models.openai import check_base_url

        check_base_url(target.partition("#")[0])
