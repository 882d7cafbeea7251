"""The older import name of ``crl_wrappers``, crl-gym's gymnasium wrappers: the same objects.

``from wrappers import ExperienceAugmentation`` keeps working where the importing project has no
``wrappers`` package of its own; where it has one, that one wins: import ``crl_wrappers``.
"""

from crl_wrappers import DEFAULT_HEADER, ExperienceAugmentation, ExperienceItem, Retriever

__all__ = ["ExperienceAugmentation", "ExperienceItem", "Retriever", "DEFAULT_HEADER"]
