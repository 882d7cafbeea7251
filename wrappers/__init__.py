"""Gymnasium wrappers over any CRL text env (they import only gymnasium).

- ``ExperienceAugmentation``: retrieved experience into the reset observation or instructions.
"""

from wrappers.experience import DEFAULT_HEADER, ExperienceAugmentation, ExperienceItem, Retriever

__all__ = ["ExperienceAugmentation", "ExperienceItem", "Retriever", "DEFAULT_HEADER"]
