"""The WebShop site in text mode: pages, clickables and upstream's navigation rules.

Holds:
- ``WebShopSite``: one shopper's session on the site (upstream's ``SimServer`` and ``SimBrowser``
  for one session, without Flask or HTML): the current page, what can be clicked on it, and
  ``search`` / ``click``, which follow upstream ``SimServer.receive`` rule for rule.
- ``visible_text``: how a piece of page text shows in upstream's ``text`` observation mode.

Upstream renders an HTML template per page and reads it back with BeautifulSoup; the text
observation is the visible text nodes, stripped, joined by `` [SEP] ``. This module builds the
same list of text nodes directly, page by page, in the templates' order:

- search page: ``WebShop``, ``Instruction:``, the instruction, ``Search`` (the search bar);
- results: ``Back to Search``, ``Page N (Total results: T)``, ``< Prev`` (after page 1),
  ``Next >`` (always, so paging past the end shows an empty page), then per product its ASIN,
  title and price, 10 a page, at most 50 results;
- item page: ``Back to Search``, ``< Prev``, each option group's name and values, title, price,
  rating, ``Description``, ``Features``, ``Reviews``, ``Buy Now``;
- sub-pages (Description / Features / Reviews): ``Back to Search``, ``< Prev`` and the text;
- done page: upstream's thank-you page with the score.

Navigation (upstream ``receive``): ``Back to Search`` returns to the search page and forgets the
search; ``Next >`` / ``< Prev`` page the results; ``< Prev`` on an item goes back to the results
(forgetting the chosen options), on a sub-page back to the item; a product link opens the item;
an option value selects it in its group; ``Buy Now`` ends the episode with the score. A search
from any page shows page 1 of its results and clears the product and its options.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from crl_envs.webshop.data import Catalogue
from crl_envs.webshop.reward import TitleNouns, get_reward
from crl_envs.webshop.search import LuceneBM25

__all__ = [
    "WebShopSite", "visible_text", "SEARCH_RETURN_N", "PRODUCT_WINDOW", "END_BUTTON",
    "NEXT_PAGE", "PREV_PAGE", "BACK_TO_SEARCH", "SUB_PAGES",
]

SEARCH_RETURN_N = 50
PRODUCT_WINDOW = 10
END_BUTTON = "Buy Now"
NEXT_PAGE = "Next >"
PREV_PAGE = "< Prev"
BACK_TO_SEARCH = "Back to Search"
SUB_PAGES = ("Description", "Features", "Reviews")
_ASCII_SPACES = "\x20\x0a\x09\x0c\x0d"


def visible_text(node: str) -> str | None:
    """One HTML text node as upstream's text mode shows it; ``None`` if it is not shown.

    BeautifulSoup turns a node of ASCII white space into ``"\\n"`` (dropped by upstream) when it
    holds a newline, else into ``" "`` (kept, as an empty segment); other nodes are stripped.

    >>> visible_text("  Price: $5 "), visible_text(" \\n "), visible_text(" ")
    ('Price: $5', None, '')
    """
    if not node:
        return None
    if not node.strip(_ASCII_SPACES):
        return None if "\n" in node else ""
    return node.strip()


def _flask_tojson(value: Any) -> str:
    # Flask 2.1's ``tojson`` filter: sorted keys, ASCII, HTML-unsafe characters as \\u escapes
    text = json.dumps(value, sort_keys=True)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
        text = text.replace(char, escape)
    return text


@dataclass
class Clickable:
    """Something on a page that ``click[...]`` can name: a button, a product link or an option."""

    kind: str  # "button", "product" or "option"
    option_name: str | None = None


@dataclass
class WebShopSite:
    """One session on the WebShop site: state, pages, and upstream's search and click rules.

    Example (needs the WebShop data):
        >>> from crl_envs.webshop.env import shared_resources
        >>> res = shared_resources()
        >>> site = WebShopSite(res.catalogue, res.engine, res.nouns, res.goals[0])
        >>> site.search("toothbrush"); site.page
        'search_results'
    """

    catalogue: Catalogue
    engine: LuceneBM25
    nouns: TitleNouns
    goal: dict[str, Any]
    page: str = "index"  # index, search_results, item_page, item_sub_page, done
    keywords: list[str] | None = None
    page_number: int | None = None
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    score: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    _clickables: dict[str, Clickable] | None = field(default=None, repr=False)

    # ------------------------------------------------------------------ actions
    def search(self, keywords: str) -> None:
        """Run a search (upstream ``search_results``): page 1, no product, no options."""
        self._clickables = None
        self.keywords = keywords.split(" ")
        self.results = self._top_products(" ".join(self.keywords))
        self._show_results(1)

    def click(self, name: str) -> bool:
        """Click the clickable ``name`` (lower-case, on this page); True when the episode ended."""
        clickable = self.clickables()[name]
        self._clickables = None
        if name == END_BUTTON.lower():
            self._buy()
            return True
        if name == BACK_TO_SEARCH.lower():
            self.page, self.keywords, self.page_number, self.asin = "index", None, None, None
            self.options, self.results = {}, []
        elif name == NEXT_PAGE.lower() and self.page == "search_results":
            self._show_results(self.page_number + 1)
        elif name == PREV_PAGE.lower() and self.page == "search_results":
            self._show_results(self.page_number - 1)
        elif name == PREV_PAGE.lower() and self.page == "item_sub_page":
            self.page = "item_page"
        elif name == PREV_PAGE.lower() and self.page == "item_page":
            self._show_results(self.page_number)
        elif name in (s.lower() for s in SUB_PAGES):
            self.page, self.sub_page = "item_sub_page", next(s for s in SUB_PAGES if s.lower() == name)
        else:
            if clickable.kind == "product":
                self.asin = name.upper()
            elif clickable.kind == "option":
                self.options[clickable.option_name] = name
            self.page = "item_page"
        return False

    def _top_products(self, query: str) -> list[dict[str, Any]]:
        products = self.catalogue.products
        return [products[i] for i in self.engine.search(query, k=SEARCH_RETURN_N)]

    def _show_results(self, page_number: int) -> None:
        self._clickables = None
        self.page, self.page_number, self.asin, self.options = "search_results", page_number, None, {}

    def _buy(self) -> None:
        product = self.catalogue.by_asin[self.asin]
        self.score, self.reward_info = get_reward(
            product, self.goal, price=self.catalogue.prices[self.asin], options=self.options,
            nouns=self.nouns,
        )
        self.page = "done"

    # ------------------------------------------------------------------ what the page shows
    @property
    def has_search_bar(self) -> bool:
        return self.page == "index"

    @property
    def product(self) -> dict[str, Any] | None:
        return self.catalogue.by_asin.get(self.asin) if self.asin else None

    def page_results(self) -> list[dict[str, Any]]:
        start = (self.page_number - 1) * PRODUCT_WINDOW
        return self.results[start:start + PRODUCT_WINDOW]

    def clickables(self) -> dict[str, Clickable]:
        """Upstream ``get_available_actions``: lower-cased buttons and links, then option values."""
        if self._clickables is not None:
            return self._clickables
        buttons: list[str] = []
        found: dict[str, Clickable] = {}
        if self.page == "index":
            buttons = ["Search"]
        elif self.page == "search_results":
            buttons = [BACK_TO_SEARCH] + ([PREV_PAGE] if self.page_number > 1 else []) + [NEXT_PAGE]
        elif self.page == "item_page":
            buttons = [BACK_TO_SEARCH, PREV_PAGE, *SUB_PAGES, END_BUTTON]
        elif self.page == "item_sub_page":
            buttons = [BACK_TO_SEARCH, PREV_PAGE]
        for text in buttons:
            found[text.lower()] = Clickable("button")
        if self.page == "search_results":
            for product in self.page_results():
                found[product["asin"].lower()] = Clickable("product")
        if self.page == "item_page":
            for option_name, values in self.product["options"].items():
                for value in values:
                    found[f"{value}"] = Clickable("option", option_name)
        self._clickables = found
        return found

    def text_nodes(self) -> list[str | None]:
        """The page's text nodes, in document order, before ``visible_text``."""
        instruction = ["Instruction:", self.goal["instruction_text"]]
        if self.page == "index":
            return ["WebShop", *instruction, "Search"]
        if self.page == "search_results":
            nodes = [*instruction, BACK_TO_SEARCH,
                     f"Page {self.page_number} (Total results: {len(self.results)})"]
            nodes += ([PREV_PAGE] if self.page_number > 1 else []) + [NEXT_PAGE]
            for product in self.page_results():
                nodes += [product["asin"], product["Title"], product["Price"]]
            return nodes
        product = self.product
        if self.page == "item_page":
            nodes = [*instruction, BACK_TO_SEARCH, PREV_PAGE]
            for option_name, values in product["options"].items():
                nodes += [f"{option_name}", *(f"{v}" for v in values)]
            nodes += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}",
                      *SUB_PAGES, END_BUTTON]
            return nodes
        if self.page == "item_sub_page":
            nodes = [*instruction, BACK_TO_SEARCH, PREV_PAGE]
            if self.sub_page == "Description":
                nodes.append(product["Description"])
            elif self.sub_page == "Features":
                nodes += [f" {point}" for point in product["BulletPoints"]]
            else:
                for review in product["Reviews"]:
                    nodes += [f'"{review["title"]}"', f"{review['score']}", f"{review['body']}"]
            return nodes
        # done page: upstream's thank-you page; its hidden block is text too
        return [
            "Thank you for shopping with us!", "Your code: ", "None",
            " (Paste it in your MTurk interface.)", "Purchased", "asin", self.asin, "options",
            _flask_tojson(self.options), "attrs", "None", "category", "None", "query", "None",
            "product category", "None", "Target", "asin", "options", "attrs", "price upper",
            "instuction text", "category", "product category", "query", "Goal ", "None",
            "Reward", "Your score (min 0.0, max 1.0)", f"{self.score}", "Reward Details ", "None",
        ]

    def observation(self) -> str:
        """The page as upstream's ``text`` observation: visible text joined by `` [SEP] ``."""
        shown = (visible_text(node) for node in self.text_nodes())
        return " [SEP] ".join(text for text in shown if text is not None)
