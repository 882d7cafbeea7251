"""MiniHack (Room, Maze, KeyRoom, River) on the real NetHack engine, as CRL text envs.

- ``render``: the fog-of-war text view of a NetHack map (apart from any env);
- ``env``: ``MiniHackEnv`` (one class, the task and variant are kwargs) and ``make_raw_env``;
- ``oracle``: ``MiniHackOracle``, a planner that reads only the text observation.
"""

from importlib.util import find_spec

for _module in ("nle", "minihack"):
    if find_spec(_module) is None:
        raise ImportError("The MiniHack envs need the NetHack engine (nle) and minihack: "
                          "pip install 'crl-gym[minihack]'.", name=_module)

from crl_envs.minihack.env import TASKS, MiniHackEnv, make_raw_env  # noqa: E402

__all__ = ["TASKS", "MiniHackEnv", "make_raw_env"]
