"""Deprecated: the older import name of ``crl_wrappers.experience`` (importing it warns, through
``wrappers``): the same objects."""

from crl_wrappers.experience import (
    DEFAULT_HEADER,
    ExperienceAugmentation,
    ExperienceItem,
    Retriever,
    retrieval_query,
)

__all__ = ["ExperienceItem", "Retriever", "ExperienceAugmentation", "DEFAULT_HEADER",
           "retrieval_query"]
