"""The older import name of ``crl_wrappers.experience``: the same objects."""

from crl_wrappers.experience import (
    DEFAULT_HEADER,
    ExperienceAugmentation,
    ExperienceItem,
    Retriever,
    retrieval_query,
)

__all__ = ["ExperienceItem", "Retriever", "ExperienceAugmentation", "DEFAULT_HEADER",
           "retrieval_query"]
