"""Prompt templates of the experience extractor.

The canonical files live in ``assets/prompts/`` (one ``string.Template`` a file, ``$name``
placeholders, so braces in transcripts need no escaping). ``load_prompt`` looks in
``$CRL_PROMPTS_DIR`` first (a user's own templates), then in the shipped assets (the checkout's,
or an installed copy's: ``crl_harness.assets``).
"""

from __future__ import annotations

import os
from pathlib import Path
from string import Template

from crl_harness.assets import assets_dir

__all__ = ["PromptNotFoundError", "prompt_dirs", "load_prompt"]


class PromptNotFoundError(FileNotFoundError):
    """A prompt template is missing; the message names the places searched."""


def prompt_dirs() -> list[Path]:
    """The folders searched for templates, in order."""
    dirs = []
    if os.environ.get("CRL_PROMPTS_DIR"):
        dirs.append(Path(os.environ["CRL_PROMPTS_DIR"]).expanduser())
    dirs.append(assets_dir() / "prompts")
    return dirs


def load_prompt(name: str) -> Template:
    """The template ``NAME.txt`` (e.g. ``experience_distill``).

    Example:
        >>> "$transcript" in load_prompt("experience_distill").template
        True
    """
    for directory in prompt_dirs():
        path = directory / f"{name}.txt"
        if path.is_file():
            return Template(path.read_text(encoding="utf-8"))
    searched = ", ".join(str(d) for d in prompt_dirs())
    raise PromptNotFoundError(
        f"Prompt template '{name}.txt' not found (searched: {searched}). Set $CRL_PROMPTS_DIR to "
        "a folder holding it (crl-gym's assets/prompts has the defaults).")
