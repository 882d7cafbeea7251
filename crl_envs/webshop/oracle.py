"""A scripted WebShop shopper that knows the goal: an upper bound and a check of the env.

Holds ``WebShopOracle``. It reads the episode's goal (``env.unwrapped.goal``) and then acts only
through the text interface: it searches the instruction, opens the goal product when its ASIN
is on the page (else searches the product's title, which ranks it first), selects each goal
option, and buys; on another product's page (a noisy turn of the warm start opened it) it goes
back.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

_TABLE = re.compile(r"[\\[\\]]")

__all__ = ["WebShopOracle"]


class WebShopOracle:
    """Buys the goal product with the goal options, through ``search[...]`` / ``click[...]``.

    Example (needs the WebShop data):
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/WebShop-v0")
        >>> oracle = WebShopOracle(env)
        >>> obs, info = env.reset(seed=0); oracle.reset(obs, info)
        >>> oracle.act(obs, info).startswith("search[")
        True
    """

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self._queries: list[str] = []
        self._pending_options: list[str] = []

    def reset(self, observation: str, info: dict[str, Any]) -> None:
        goal = self.env.unwrapped.goal
        # brackets would end the search[...] action early
        self._queries = [_TABLE.sub(" ", goal["instruction_text"]), _TABLE.sub(" ", goal["name"])]
        self._pending_options = [str(v) for v in goal["goal_options"].values()]

    def act(self, observation: str, info: dict[str, Any]) -> str:
        asin = self.env.unwrapped.goal["asin"].lower()
        admissible = set(info.get("admissible_actions") or [])
        if "click[buy now]" in admissible:  # a product's page
            if (self.env.unwrapped.site.asin or "").lower() != asin:
                return "click[< prev]"  # another product (a noisy turn opened it): back
            while self._pending_options:
                option = self._pending_options.pop(0)
                if f"click[{option}]" in admissible:
                    return f"click[{option}]"
            return "click[buy now]"
        if f"click[{asin}]" in admissible:
            return f"click[{asin}]"
        if self._queries:
            return f"search[{self._queries.pop(0)}]"
        return "click[next >]"
