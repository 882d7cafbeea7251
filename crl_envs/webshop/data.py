"""The WebShop catalogue: products and their attribute annotations, loaded as upstream does.

Holds:
- ``Catalogue``: the products (as upstream ``load_products`` builds them), the text upstream
  indexes for search, and the fixed price of every product.
- ``load_catalogue``: read a dataset directory found by ``data_directory`` (which asks
  ``crl_envs.data.resolve_data``).

Two product files are understood: upstream's raw ``items_shuffle_1000.json`` (what upstream's
``setup.sh -d small`` downloads) and ``docs_1k.jsonl`` (the documents of upstream's small Lucene
index, whose ``product`` field is already in ``load_products`` form). The attribute file
``items_ins_v2_1000.json`` gives every product its ``Attributes`` and, for some, the synthetic
instruction that goals are made from.

Upstream draws the price of a product with a price range (``random.uniform`` over the range) from
the unseeded global ``random`` module, so its prices change from run to run; here they come from a
``random.Random(price_seed)``, so a catalogue is the same on every load.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from crl_envs.data import DataNotFoundError, resolve_data

__all__ = ["Catalogue", "load_catalogue", "data_directory", "RAW_PRODUCTS", "INDEX_DOCS",
           "ATTRIBUTES"]

RAW_PRODUCTS = "items_shuffle_1000.json"
INDEX_DOCS = "docs_1k.jsonl"
ATTRIBUTES = "items_ins_v2_1000.json"
NUM_PRODUCTS = 1000  # the small WebShop: upstream's ``num_products=1000``

# Keys upstream's ``clean_product_keys`` drops from raw products.
_DROPPED_KEYS = (
    "product_information", "brand", "brand_url", "list_price", "availability_quantity",
    "availability_status", "total_reviews", "total_answered_questions", "seller_id",
    "seller_name", "fulfilled_by_amazon", "fast_track_message", "aplus_present",
    "small_description_old",
)


@dataclass
class Catalogue:
    """The products of a WebShop, in upstream's index order, with their search text and prices."""

    products: list[dict[str, Any]]
    """Products as upstream ``load_products`` builds them (``Title``, ``options``, ``Attributes``...)."""
    search_texts: list[str]
    """Per product, the text upstream puts into its Lucene index (``contents``)."""
    prices: dict[str, float]
    """ASIN -> the price used for the price term of the reward (fixed by ``price_seed``)."""

    def __post_init__(self) -> None:
        self.by_asin: dict[str, dict[str, Any]] = {p["asin"]: p for p in self.products}


def _raw_to_product(raw: dict[str, Any]) -> dict[str, Any]:
    """One raw scraped product -> upstream ``load_products`` form (same fields, same parsing)."""
    product = {k: v for k, v in raw.items() if k not in _DROPPED_KEYS}
    product["Title"] = raw["name"]
    product["Description"] = raw["full_description"]
    product["Reviews"] = []  # upstream's review file is not loaded by load_products
    product["Rating"] = "N.A."
    small = raw["small_description"]
    product["BulletPoints"] = small if isinstance(small, list) else [small]
    pricing = raw.get("pricing")
    if not pricing:
        prices, tag = [100.0], "$100.0"
    else:
        prices = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in pricing.split("$")[1:]]
        if len(prices) == 1:
            tag = f"${prices[0]}"
        else:
            tag = f"${prices[0]} to ${prices[1]}"
            prices = prices[:2]
    product["pricing"], product["Price"] = prices, tag
    options: dict[str, list[str]] = {}
    option_to_image: dict[str, Any] = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = content["value"].strip().replace("/", " | ").lower()
            values.append(value)
            option_to_image[value] = content.get("image")
        options[name.lower()] = values
    product["options"], product["option_to_image"] = options, option_to_image
    product["MainImage"] = raw["images"][0]
    product["query"] = raw["query"].lower().strip()
    return product


def _search_text(product: dict[str, Any]) -> str:
    """The ``contents`` upstream's ``convert_product_file_format.py`` indexes for a product."""
    option_text = ", and ".join(
        f"{name}: {', '.join(values)}" for name, values in product.get("options", {}).items()
    )
    return " ".join(
        [product["Title"], product["Description"], product["BulletPoints"][0], option_text]
    ).lower()


def _read_products(directory: Path) -> tuple[list[dict[str, Any]], list[str]]:
    raw_path, docs_path = directory / RAW_PRODUCTS, directory / INDEX_DOCS
    if raw_path.exists():
        with open(raw_path, encoding="utf-8") as handle:
            raws = json.load(handle)[:NUM_PRODUCTS]
        products, seen = [], set()
        for raw in raws:  # upstream skips bad and duplicate ASINs
            asin = raw["asin"]
            if asin == "nan" or len(asin) > 10 or asin in seen:
                continue
            seen.add(asin)
            products.append(_raw_to_product(raw))
        return products, [_search_text(p) for p in products]
    products, texts = [], []
    with open(docs_path, encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                doc = json.loads(line)
                products.append(doc["product"])
                texts.append(doc["contents"])
    return products, texts


def _product_prices(products: list[dict[str, Any]], rng: random.Random) -> dict[str, float]:
    """Upstream ``generate_product_prices``, with a seeded generator instead of global ``random``."""
    prices = {}
    for product in products:
        pricing = product["pricing"]
        if not pricing:
            prices[product["asin"]] = 100.0
        elif len(pricing) == 1:
            prices[product["asin"]] = pricing[0]
        else:
            prices[product["asin"]] = rng.uniform(*pricing[:2])
    return prices


def data_directory(path: str | os.PathLike | None = None) -> Path:
    """The WebShop data directory: ``path`` or the standard data places, with the attribute file
    and one of the product files.

    Raises ``DataNotFoundError`` (naming ``crl data fetch webshop``) when no directory holds them.
    """
    directory = resolve_data("webshop", path, required=(ATTRIBUTES,))
    if not (directory / RAW_PRODUCTS).exists() and not (directory / INDEX_DOCS).exists():
        raise DataNotFoundError(
            f"Dataset 'webshop' in {directory} has neither {RAW_PRODUCTS} nor {INDEX_DOCS}. "
            "Run `crl data fetch webshop`, or set $CRL_DATA_DIR to a folder holding 'webshop/'."
        )
    return directory


def load_catalogue(path: str | os.PathLike | None = None, price_seed: int = 0) -> Catalogue:
    """Load the small WebShop catalogue from ``path`` or the standard data places.

    Raises ``DataNotFoundError`` (naming ``crl data fetch webshop``) when no directory holds the
    attribute file and one of the product files.
    """
    directory = data_directory(path)
    products, texts = _read_products(directory)
    with open(directory / ATTRIBUTES, encoding="utf-8") as handle:
        annotations = json.load(handle)
    for product in products:
        # upstream load_products(human_goals=False): attributes and the synthetic instruction
        note = annotations.get(product["asin"], {})
        product["Attributes"] = note.get("attributes", ["DUMMY_ATTR"])
        product["instruction_text"] = note.get("instruction")
        product["instruction_attributes"] = note.get("instruction_attributes")
    prices = _product_prices(products, random.Random(price_seed))
    return Catalogue(products=products, search_texts=texts, prices=prices)
