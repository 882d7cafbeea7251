"""Deprecated: the older import name of ``crl_wrappers``, kept only in a checkout of crl-gym.

The wheel does not ship it (a generic top-level ``wrappers`` package would overwrite, or be
overwritten by, any other distribution's ``wrappers``): ``import wrappers`` works only where a
checkout's root is on ``sys.path``, warns ``DeprecationWarning`` and gives every public name of
``crl_wrappers``, the same objects (re-exported, never copied, so the alias cannot drift).
Import ``crl_wrappers``.
"""

import warnings

from crl_wrappers import *  # noqa: F403 - the alias is crl_wrappers' public names, whatever they are
from crl_wrappers import __all__  # noqa: F401

# stacklevel 2: the warning points at the importing line of the user's code.
warnings.warn("`wrappers` is deprecated and not installed by the crl-gym wheel: import "
              "`crl_wrappers` (the same objects)", DeprecationWarning, stacklevel=2)
