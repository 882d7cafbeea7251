"""Error types whose message tells the user what to do next.

The ``crl`` command line prints these as one line instead of a traceback.
"""

from __future__ import annotations

__all__ = ["UserFacingError"]


class UserFacingError(Exception):
    """A problem the user can fix (missing data, missing model, bad config); the message says how."""
