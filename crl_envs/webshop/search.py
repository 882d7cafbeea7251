"""WebShop's product search: Lucene BM25 over upstream's index text, reproduced in Python.

Holds:
- ``analyze``: the analyzer upstream's index was built with (pyserini/Anserini's default English
  analyzer): Unicode word segmentation (UAX #29, as Lucene's ``StandardTokenizer``), English
  possessive removal, lower-casing, Lucene's 33 English stop words, Porter stemming (Martin
  Porter's reference version, which Lucene's ``PorterStemmer`` ports).
- ``LuceneBM25``: Lucene 9's ``BM25Similarity`` (k1 0.9, b 0.4) with its one-byte document-length
  norms, float32 arithmetic, repeated query terms as boosts (Anserini's bag-of-words query) and
  equal scores ordered by document id (Anserini's tie-breaking reranker), so rankings match real
  Lucene's (see ``benchmarks/webshop_bench.py``
  for the measured agreement).

Why not rank-bm25 or bm25s: rank-bm25's BM25Okapi uses another idf; bm25s' ``method="lucene"``
uses Lucene's formula but exact document lengths, not Lucene's quantised ones, which reorders
near ties. Both are measured against real Lucene in the benchmark; the exact scorer here is what
reaches the required agreement.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from crl_envs.errors import require_extra

# Checked first, so gym.make("CRL/WebShop-v0") without the extra names it, not a bare module.
require_extra("webshop", ("regex", "nltk"), "The WebShop env")

import regex  # noqa: E402
from nltk.stem.porter import PorterStemmer  # noqa: E402

__all__ = ["ENGLISH_STOP_WORDS", "analyze", "tokenize", "LuceneBM25"]

# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, the stop set of Anserini's default analyzer.
ENGLISH_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)

# UAX #29 word classes, as Lucene's StandardTokenizer uses them.
_LETTER = r"[\p{WB=ALetter}\p{WB=Hebrew_Letter}]"
_NUMBER = r"\p{WB=Numeric}"
_UNIT = r"[\p{WB=ALetter}\p{WB=Hebrew_Letter}\p{WB=Numeric}\p{WB=Katakana}\p{WB=ExtendNumLet}]"
_EXTEND = r"[\p{WB=Extend}\p{WB=Format}\p{WB=ZWJ}]*"
_MID_LETTER = r"[\p{WB=MidLetter}\p{WB=MidNumLet}\p{WB=Single_Quote}]"
_MID_NUMBER = r"[\p{WB=MidNum}\p{WB=MidNumLet}\p{WB=Single_Quote}]"
# Extended_Pictographic as Lucene 9's tokenizer has it (Unicode 14 emoji data, through ICU4J 70;
# the regex module's own table is narrower, e.g. it lacks U+2605 BLACK STAR). With the digits,
# regional indicators and modifiers taken out, Lucene's other emoji characters add nothing to it.
_EMOJI_CHAR = "[" + "".join(
    f"\\U{int(lo, 16):08x}-\\U{int(hi or lo, 16):08x}"
    for lo, _, hi in (item.partition("-") for item in (
        "a9 ae 203c 2049 2122 2139 2194-2199 21a9-21aa 231a-231b 2328 2388 23cf 23e9-23f3 "
        "23f8-23fa 24c2 25aa-25ab 25b6 25c0 25fb-25fe 2600-2605 2607-2612 2614-2685 2690-2705 "
        "2708-2712 2714 2716 271d 2721 2728 2733-2734 2744 2747 274c 274e 2753-2755 2757 "
        "2763-2767 2795-2797 27a1 27b0 27bf 2934-2935 2b05-2b07 2b1b-2b1c 2b50 2b55 3030 303d "
        "3297 3299 1f000-1f0ff 1f10d-1f10f 1f12f 1f16c-1f171 1f17e-1f17f 1f18e 1f191-1f19a "
        "1f1ad-1f1e5 1f201-1f20f 1f21a 1f22f 1f232-1f23a 1f23c-1f23f 1f249-1f3fa 1f400-1f53d "
        "1f546-1f64f 1f680-1f6ff 1f774-1f77f 1f7d5-1f7ff 1f80c-1f80f 1f848-1f84f 1f85a-1f85f "
        "1f888-1f88f 1f8ae-1f8ff 1f90c-1f93a 1f93c-1f945 1f947-1faff 1fc00-1fffd"
    ).split())
) + "]"
_EXTEND_SANS_SELECTOR = r"[[\p{WB=Extend}\p{WB=Format}]--[\ufe0e\ufe0f\u200d]]*"
_EMOJI = (
    rf"\u200d*(?:{_EMOJI_CHAR}{_EXTEND_SANS_SELECTOR}\ufe0f?"
    rf"(?:\p{{Emoji_Modifier}}{_EXTEND_SANS_SELECTOR})?|\p{{Emoji_Modifier}}{_EXTEND_SANS_SELECTOR})"
)
_WORD = regex.compile(
    # a run of letters/digits; a letter-mid-letter or digit-mid-digit joint continues the word
    rf"(?:{_UNIT}{_EXTEND})+"
    rf"(?:(?:(?<={_LETTER}{_EXTEND}){_MID_LETTER}(?={_EXTEND}{_LETTER})"
    rf"|(?<={_NUMBER}{_EXTEND}){_MID_NUMBER}(?={_EXTEND}{_NUMBER}))"
    rf"{_EXTEND}(?:{_UNIT}{_EXTEND})+)*"
    # south-east Asian scripts: one token a run; ideographs and hiragana: one token a character
    rf"|(?:\p{{LB=Complex_Context}}{_EXTEND})+"
    rf"|[\p{{Script=Han}}\p{{Script=Hiragana}}]{_EXTEND}"
    # emoji (UTS #51 sequences, as Lucene's tokenizer keeps them): one token each
    rf"|{_EMOJI}(?:\u200d{_EMOJI})*",
    flags=regex.V1,
)
_MAX_TOKEN_LENGTH = 255  # StandardTokenizer splits longer tokens
_POSSESSIVE_MARKS = ("'", "\u2019", "\uff07")
_STEMMER = PorterStemmer(mode=PorterStemmer.MARTIN_EXTENSIONS)


def tokenize(text: str) -> list[str]:
    """Lucene ``StandardTokenizer`` tokens of ``text`` (case kept).

    >>> tokenize("Men's 3.5-inch shoes, e.g. size:large")
    ["Men's", '3.5', 'inch', 'shoes', 'e.g', 'size:large']
    """
    tokens = []
    for match in _WORD.finditer(text):
        token = match.group()
        if token.strip("_") == "":  # a lone connector is no word
            continue
        while len(token) > _MAX_TOKEN_LENGTH:
            tokens.append(token[:_MAX_TOKEN_LENGTH])
            token = token[_MAX_TOKEN_LENGTH:]
        tokens.append(token)
    return tokens


@lru_cache(maxsize=1 << 17)
def _normalize(token: str) -> str | None:
    if len(token) >= 2 and token[-2] in _POSSESSIVE_MARKS and token[-1] in "sS":
        token = token[:-2]
    token = token.lower()
    if token in ENGLISH_STOP_WORDS:
        return None
    return _STEMMER.stem(token, to_lowercase=False)


def analyze(text: str) -> list[str]:
    """The index terms of ``text`` under Anserini's default English analyzer.

    >>> analyze("The Women's Running Shoes with Rubber Soles")
    ['women', 'run', 'shoe', 'rubber', 'sole']
    """
    terms = []
    for token in tokenize(text):
        term = _normalize(token)
        if term:
            terms.append(term)
    return terms


# Lucene's SmallFloat.intToByte4 / byte4ToInt: document lengths are stored in one byte.
def _int_to_int4(value: int) -> int:
    bits = value.bit_length()
    if bits < 4:
        return value
    shift = bits - 4
    return ((value >> shift) & 0x07) | ((shift + 1) << 3)


def _int4_to_int(code: int) -> int:
    bits, shift = code & 0x07, (code >> 3) - 1
    return bits if shift == -1 else (bits | 0x08) << shift


_FREE_VALUES = 255 - _int_to_int4(2**31 - 1)


def length_to_norm(length: int) -> int:
    """The one-byte norm Lucene stores for a field of ``length`` terms."""
    if length < _FREE_VALUES:
        return length
    return _FREE_VALUES + _int_to_int4(length - _FREE_VALUES)


def norm_to_length(norm: int) -> int:
    """The document length Lucene's BM25 reads back from a stored norm."""
    if norm < _FREE_VALUES:
        return norm
    return _FREE_VALUES + _int4_to_int(norm - _FREE_VALUES)


class LuceneBM25:
    """Lucene 9 BM25 ranking over a list of documents, score for score.

    Equal scores are ordered by ``ids`` (as strings), as pyserini's searcher orders them; without
    ``ids``, by position.

    Example:
        >>> engine = LuceneBM25(["red running shoes", "blue shoes", "red apple"])
        >>> engine.search("red shoes", k=2)
        [0, 1]
    """

    def __init__(self, documents: Sequence[str], ids: Sequence[str] | None = None,
                 k1: float = 0.9, b: float = 0.4,
                 term_counts: Sequence[Mapping[str, int]] | None = None) -> None:
        self.k1, self.b = k1, b
        self.num_docs = len(documents)
        if ids is not None and len(ids) != self.num_docs:
            raise ValueError(f"{len(ids)} ids for {self.num_docs} documents.")
        if term_counts is None:  # analysing is most of the start-up; callers may cache it
            term_counts = [Counter(analyze(text)) for text in documents]
        elif len(term_counts) != self.num_docs:
            raise ValueError(f"{len(term_counts)} term counts for {self.num_docs} documents.")
        order = sorted(range(self.num_docs), key=lambda i: ids[i]) if ids else range(self.num_docs)
        self._tie_rank = np.empty(self.num_docs, dtype=np.int64)
        self._tie_rank[list(order)] = np.arange(self.num_docs)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        lengths = np.zeros(self.num_docs, dtype=np.int64)
        for doc_id, counts in enumerate(term_counts):
            lengths[doc_id] = sum(counts.values())
            for term, tf in counts.items():
                doc_ids, tfs = postings.setdefault(term, ([], []))
                doc_ids.append(doc_id)
                tfs.append(tf)
        self._postings = {
            term: (np.asarray(doc_ids, dtype=np.int64), np.asarray(tfs, dtype=np.float32))
            for term, (doc_ids, tfs) in postings.items()
        }
        self._doc_freq = {term: len(doc_ids) for term, (doc_ids, _) in self._postings.items()}
        avgdl = np.float32(lengths.sum() / max(self.num_docs, 1))
        # BM25Similarity's per-norm cache: 1 / (k1 * ((1 - b) + b * dl / avgdl)), in float32
        table = np.array([norm_to_length(n) for n in range(256)], dtype=np.float32)
        k1_, b_ = np.float32(k1), np.float32(b)
        cache = np.float32(1.0) / (k1_ * ((np.float32(1.0) - b_) + b_ * table / avgdl))
        norms = np.array([length_to_norm(int(n)) for n in lengths], dtype=np.int64)
        self._norm_inverse = cache[norms].astype(np.float32)
        # per posting, the term's score for a query that holds it once (the usual case)
        self._once = {term: self._term_scores(term, 1) for term in self._postings}

    def idf(self, term: str) -> np.float32:
        """Lucene's BM25 idf of an (analysed) term: ln(1 + (N - df + 0.5) / (df + 0.5))."""
        df = self._doc_freq.get(term, 0)
        return np.float32(math.log(1 + (self.num_docs - df + 0.5) / (df + 0.5)))

    def _term_scores(self, term: str, count: int) -> np.ndarray:
        # BM25Scorer.score: weight - weight / (1 + freq * normInverse), all in float32
        ids, tfs = self._postings[term]
        weight = np.float32(count) * self.idf(term)
        return weight - weight / (np.float32(1.0) + tfs * self._norm_inverse[ids])

    def scores(self, query: str) -> np.ndarray:
        """Every document's score for ``query`` (float32, Lucene's sum of per-term scores)."""
        total = np.zeros(self.num_docs, dtype=np.float64)
        for term, count in Counter(analyze(query)).items():
            if term in self._postings:
                term_scores = self._once[term] if count == 1 else self._term_scores(term, count)
                total[self._postings[term][0]] += term_scores
        return total.astype(np.float32)

    def search(self, query: str, k: int = 50) -> list[int]:
        """Indices of the top ``k`` matching documents, best first."""
        scores = self.scores(query)
        matched = np.flatnonzero(scores > 0)
        order = matched[np.lexsort((self._tie_rank[matched], -scores[matched]))]
        return order[:k].tolist()
