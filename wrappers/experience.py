"""Deprecated: the older import name of ``crl_wrappers.experience`` (importing it warns, through
``wrappers``): its public names, the same objects."""

from crl_wrappers.experience import *  # noqa: F403 - the alias is the module's public names
from crl_wrappers.experience import __all__  # noqa: F401
