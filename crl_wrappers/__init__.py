"""Gymnasium wrappers over any CRL text env (they import only gymnasium).

- ``ExperienceAugmentation``: retrieved experience into the reset observation or instructions.

The import name is ``crl_wrappers``, one no other project uses; ``wrappers``, the older name, still
works where the importing project has no ``wrappers`` package of its own.
"""

from crl_wrappers.experience import (
    DEFAULT_HEADER,
    ExperienceAugmentation,
    ExperienceItem,
    Retriever,
)

__all__ = ["ExperienceAugmentation", "ExperienceItem", "Retriever", "DEFAULT_HEADER"]
