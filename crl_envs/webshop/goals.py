"""WebShop's synthetic goals, in upstream's order, with upstream's splits and sampling weights.

Holds:
- ``synthetic_goals``: upstream ``get_synthetic_goals`` followed by the server's fixed shuffle
  (``random.seed(233)``), so goal ``i`` here is upstream's session ``i``; 6,910 goals on the
  small catalogue.
- ``SPLITS`` / ``split_indices``: the baseline's splits of that order: test 0-500, eval
  500-1500, train the rest.

A goal asks for one product with every combination of its options, the product's synthetic
instruction, and a price bound drawn from the decades just above the product's price. Upstream
draws that bound from the unseeded global ``random``; here ``random.Random(price_seed)`` draws it,
so goals are the same on every load. The weight of a goal is upstream's attribute-frequency
weight: the mean over its attributes of 1 / (number of goals with that attribute).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from typing import Any

from crl_envs.webshop.data import Catalogue

__all__ = ["PRICE_RANGE", "SPLITS", "synthetic_goals", "split_indices"]

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
GOAL_SHUFFLE_SEED = 233  # upstream SimServer: random.seed(233); random.shuffle(self.goals)
SPLITS = ("train", "eval", "test", "all")


def synthetic_goals(catalogue: Catalogue, price_seed: int = 0) -> list[dict[str, Any]]:
    """Every synthetic goal of ``catalogue``, in upstream's shuffled order, with weights."""
    rng = random.Random(price_seed)
    goals: list[dict[str, Any]] = []
    attribute_counts: dict[str, int] = defaultdict(int)
    for product in catalogue.products:
        if product.get("instruction_text") is None:
            continue
        attributes = product["instruction_attributes"]
        price = catalogue.prices[product["asin"]]
        bounds = [p for p in PRICE_RANGE if p > price][:4]
        if len(bounds) >= 2:
            _, price_upper = sorted(rng.sample(bounds, 2))
            price_text = f", and price lower than {price_upper:.2f} dollars"
        else:
            price_upper, price_text = 1000000, ""
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][n] for n in names)):
            goal_options = dict(zip(names, combination, strict=True))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append({
                "asin": product["asin"],
                "category": product["category"],
                "query": product["query"],
                "name": product["Title"],
                "product_category": product["product_category"],
                "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                "attributes": attributes,
                "price_upper": price_upper,
                "goal_options": goal_options,
            })
            for attribute in attributes:
                attribute_counts[attribute] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / attribute_counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals


def split_indices(split: str, num_goals: int) -> range:
    """Goal indices of a split, as upstream's baseline (``baseline_models/env.py``) cuts them."""
    if split == "test":
        return range(0, min(500, num_goals))
    if split == "eval":
        return range(min(500, num_goals), min(1500, num_goals))
    if split == "train":
        return range(min(1500, num_goals), num_goals)
    if split == "all":
        return range(num_goals)
    raise ValueError(f"split={split!r} is not one of {SPLITS}.")
