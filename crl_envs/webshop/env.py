"""``CRL/WebShop-v0``: shop for the product an instruction describes, in upstream's text mode.

Holds:
- ``WebShopEnv``: the text env (``TextEnv`` contract) over ``WebShopSite``.
- ``shared_resources``: the catalogue, search index, goals and title tagger, loaded once per
  process and shared by every env instance (they are read-only).

An episode is one synthetic goal (6,910 on the small catalogue, in upstream's order). ``reset``
picks it: ``options={"task_id": i}`` for goal ``i``, else a draw from the split (``"train"``
goals 1500 on, ``"eval"`` 500-1500, ``"test"`` 0-500, ``"all"``) weighted by upstream's
attribute-frequency weights (``goal_weighting=False``: uniform, as upstream's baseline draws).
Every draw comes from the env's seeded generator; product prices and price bounds from
``price_seed`` (upstream leaves them unseeded).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from crl_envs.base import TextEnv, Transition
from crl_envs.data import cache_dir
from crl_envs.webshop.data import Catalogue, load_catalogue
from crl_envs.webshop.engine import WebShopSite
from crl_envs.webshop.goals import SPLITS, split_indices, synthetic_goals
from crl_envs.webshop.reward import TitleNouns
from crl_envs.webshop.search import LuceneBM25, analyze

__all__ = ["WebShopEnv", "WebShopResources", "shared_resources"]

# upstream parse_action's r'(.+)\[(.+)\]', but over the whole (stripped) action: upstream's
# re.match ignores text after the last ']', which would take prose around an action for the action
_ACTION = re.compile(r"(.+)\[(.+)\]")
SEARCH_PLACEHOLDER = "search[<query>]"
# Upstream's queries are a few keywords; a model's runaway output as a query would cost seconds
# and memory in the tokenizer and the page's keyword list, so longer actions are invalid.
MAX_QUERY_CHARS = 1_000
INDEX_FORMAT = 1  # bump when the analyzer changes, so cached term counts are rebuilt

INSTRUCTIONS = """You are shopping on WebShop for the product the instruction describes.
Each observation is the current web page: its visible text, separated by [SEP].
Actions (one per step):
- search[QUERY]: search the catalogue for QUERY (from any page); shows page 1 of the results.
- click[TEXT]: click a button, product link (its ASIN) or option value shown on the page, e.g.
  click[b09xyz1234], click[next >], click[< prev], click[back to search], click[description],
  click[features], click[reviews], click[large], click[buy now].
Clicking a product opens it; clicking an option value selects it; click[buy now] buys the
product with the selected options and ends the episode. Success: the score of the purchase
(product type, attributes, options and price against the instruction) is 1.0."""


@dataclass(frozen=True)
class WebShopResources:
    """The read-only parts of WebShop, shared by every env of a process."""

    catalogue: Catalogue
    engine: LuceneBM25
    goals: list[dict[str, Any]]
    weights: np.ndarray
    nouns: TitleNouns


def _cached_term_counts(texts: list[str]) -> list[dict[str, int]]:
    """The analysed index text of every product, from a cache file keyed by the texts' hash."""
    digest = hashlib.sha256("\0".join(texts).encode("utf-8")).hexdigest()[:16]
    path = cache_dir() / "webshop" / f"term_counts-v{INDEX_FORMAT}-{digest}.json"
    try:
        counts = json.loads(path.read_text(encoding="utf-8"))
        if len(counts) == len(texts):
            return counts
    except (OSError, ValueError):
        pass  # absent or damaged: rebuilt below
    counts = [Counter(analyze(text)) for text in texts]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(counts, handle)
        os.replace(tmp, path)  # atomic: a crash never leaves half a cache
    except OSError:
        pass  # a read-only cache only costs start-up time
    return counts


@lru_cache(maxsize=4)
def shared_resources(data_dir: str | None = None, price_seed: int = 0) -> WebShopResources:
    """Load (once per arguments) the catalogue, the search index, the goals and the tagger."""
    catalogue = load_catalogue(data_dir, price_seed=price_seed)
    engine = LuceneBM25(catalogue.search_texts, ids=[p["asin"] for p in catalogue.products],
                        term_counts=_cached_term_counts(catalogue.search_texts))
    goals = synthetic_goals(catalogue, price_seed=price_seed)
    weights = np.array([goal["weight"] for goal in goals], dtype=np.float64)
    nouns = TitleNouns(titles=[p["Title"] for p in catalogue.products])
    nouns.check_available()  # fail at construction, not at the first purchase
    return WebShopResources(catalogue, engine, goals, weights, nouns)


class WebShopEnv(TextEnv):
    """WebShop (small, 1,000 products) in upstream's text mode, with upstream's reward.

    Reward: 1 when the purchase scores 1.0 (the paper's success), else 0; ``reward_mode="score"``
    gives upstream's 0..1 score. ``info["score"]`` is that score after a purchase.

    Example (needs the WebShop data):
        >>> import gymnasium as gym, crl_envs
        >>> env = gym.make("CRL/WebShop-v0")
        >>> obs, info = env.reset(seed=0, options={"split": "test"})
        >>> obs.startswith("WebShop [SEP] Instruction: [SEP] ")
        True
        >>> obs, reward, terminated, truncated, info = env.step("click[buy now]")
        >>> info["action_valid"]
        False
    """

    env_id = "CRL/WebShop-v0"
    instructions = INSTRUCTIONS

    def __init__(self, render_mode: str | None = None, reward_mode: str = "binary",
                 data_dir: str | os.PathLike | None = None, split: str = "train",
                 goal_weighting: bool = True, price_seed: int = 0) -> None:
        super().__init__(render_mode=render_mode, reward_mode=reward_mode)
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not one of {SPLITS}.")
        self.split = split
        self.goal_weighting = goal_weighting
        self.resources = shared_resources(str(data_dir) if data_dir else None, price_seed)
        self.goal: dict[str, Any] | None = None
        self.goal_index: int | None = None
        self.site: WebShopSite | None = None

    @property
    def goals(self) -> list[dict[str, Any]]:
        """Every goal, in upstream's order (``task_id`` indexes this list)."""
        return self.resources.goals

    # ----------------------------------------------------------------- TextEnv interface
    def _reset(self, seed: int | None, options: dict[str, Any]) -> str:
        unknown = set(options) - {"task_id", "split"}
        if unknown:
            raise ValueError(f"Unknown reset options {sorted(unknown)}; use 'task_id' and/or 'split'.")
        self.goal_index = self._choose_goal(options)
        self.goal = self.goals[self.goal_index]
        res = self.resources
        self.site = WebShopSite(res.catalogue, res.engine, res.nouns, self.goal)
        return self.site.observation()

    def _choose_goal(self, options: dict[str, Any]) -> int:
        if options.get("task_id") is not None:
            task_id = options["task_id"]
            if isinstance(task_id, bool) or not isinstance(task_id, (int, np.integer)):
                raise TypeError(f"task_id must be an int, got {type(task_id).__name__}.")
            if not 0 <= task_id < len(self.goals):
                raise ValueError(f"task_id={task_id} is out of range [0, {len(self.goals)}).")
            return int(task_id)
        split = options.get("split", self.split)
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not one of {SPLITS}.")
        indices = split_indices(split, len(self.goals))
        if len(indices) == 0:
            raise ValueError(f"split {split!r} has no goals on this catalogue.")
        if not self.goal_weighting:
            return int(indices[self.np_random.integers(len(indices))])
        weights = self.resources.weights[indices.start:indices.stop]
        return int(indices[self.np_random.choice(len(indices), p=weights / weights.sum())])

    def _step(self, action: str) -> Transition:
        site = self.site
        if len(action.strip()) > MAX_QUERY_CHARS + len("search[]"):
            return self.invalid(
                f"the action is {len(action.strip())} characters long; a search query may have "
                f"at most {MAX_QUERY_CHARS}.", self._allowed_text())
        match = _ACTION.fullmatch(action.strip())
        if match is None:
            return self.invalid(
                f"{action.strip()[:80]!r} is not search[...] or click[...].", self._allowed_text()
            )
        name, argument = match.group(1), match.group(2).lower()
        if name == "search":
            site.search(argument)
            return Transition(observation=site.observation())
        if name == "click":
            clickables = site.clickables()
            if argument == "search":
                return self.invalid("the search bar is used with search[QUERY], not clicked.",
                                    self._allowed_text())
            if argument not in clickables:
                return self.invalid(f"there is no {argument[:80]!r} to click on this page.",
                                    self._allowed_text())
            done = site.click(argument)
            if done:
                won = site.score == 1.0
                return Transition(observation=site.observation(), won=won, terminated=True,
                                  score=site.score,
                                  info={"reward_info": site.reward_info, "purchased": {
                                      "asin": site.asin, "options": dict(site.options)}})
            return Transition(observation=site.observation())
        return self.invalid(f"unknown action {name[:40]!r}; use search[...] or click[...].",
                            self._allowed_text())

    def _allowed_text(self) -> str:
        return "Valid actions: " + ", ".join(self.admissible_actions() or []) + (
            "" if self.site.has_search_bar else " (search[<query>] works from any page)")

    @property
    def task(self) -> str:
        return self.goal["instruction_text"] if self.goal else ""

    def admissible_actions(self) -> list[str] | None:
        """``click[...]`` for every clickable of the page, plus search where the page has the bar."""
        if self.site is None:
            return None
        actions = [SEARCH_PLACEHOLDER] if self.site.has_search_bar else []
        actions += [f"click[{name}]" for name in self.site.clickables() if name != "search"]
        return actions
