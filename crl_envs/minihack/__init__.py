"""MiniHack (Room, Maze, KeyRoom, River) on the real NetHack engine, as CRL text envs.

- ``render``: the fog-of-war text view of a NetHack map (apart from any env);
- ``env``: ``MiniHackEnv`` (one class, the task and variant are kwargs) and ``make_raw_env``;
- ``oracle``: ``MiniHackOracle``, a planner that reads only the text observation.
"""

from importlib.util import find_spec

from crl_envs.errors import MissingExtraError, require_extra

require_extra("minihack", ("nle", "minihack"), "The MiniHack env")
if find_spec("pkg_resources") is None:  # an extra or a pip install after [minihack] upgraded it
    raise MissingExtraError("minihack 1.0.2 imports pkg_resources, which setuptools 82 and later "
                            "no longer have: pip install 'setuptools<82'.", name="pkg_resources")

from crl_envs.minihack.env import TASKS, MiniHackEnv, make_raw_env  # noqa: E402

__all__ = ["TASKS", "MiniHackEnv", "make_raw_env"]
