"""Gymnasium wrappers over any CRL text env (they import only gymnasium).

- ``ExperienceAugmentation``: retrieved experience into the reset observation, the instructions,
  or ``info["experience"]`` alone;
- ``experience_block`` / ``with_experience``: the one rendering of that experience, for a harness
  that builds its own prompt.

The import name is ``crl_wrappers``, one no other project uses; ``wrappers``, the older name, is
deprecated and only in a checkout (the wheel does not install it).
"""

from crl_wrappers.experience import (
    DEFAULT_HEADER,
    ExperienceAugmentation,
    ExperienceItem,
    Retriever,
    experience_block,
    with_experience,
)

__all__ = ["ExperienceAugmentation", "ExperienceItem", "Retriever", "DEFAULT_HEADER", "experience_block",
           "with_experience"]
