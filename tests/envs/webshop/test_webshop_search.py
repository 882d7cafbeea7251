"""WebShop search: the analyzer, Lucene's length norms, and agreement with real Lucene's rankings."""

from __future__ import annotations

import pytest
from conftest import require_data

for _module in ("nltk", "regex"):  # the webshop extra
    pytest.importorskip(_module, reason="the webshop extra: pip install 'crl-gym[webshop]'")

from crl_envs.webshop.search import (  # noqa: E402
    LuceneBM25,
    analyze,
    length_to_norm,
    norm_to_length,
    tokenize,
)


def test_tokenizer_follows_uax29_like_lucene():
    # letters joined by ':' '.' and "'" stay one token; digits by '.' ','; '-' and '/' split
    assert tokenize("finish/frame description:solid wine-red 1,000.5 e.g. don't") == [
        "finish", "frame", "description:solid", "wine", "red", "1,000.5", "e.g", "don't"]
    # digits and letters join; a lone underscore is no token; emoji are tokens of their own
    assert tokenize("9.5cm _ a_b 😈😈 ★") == ["9.5cm", "a_b", "😈", "😈", "★"]
    # ideographs one a character
    assert tokenize("中文") == ["中", "文"]


def test_analyzer_possessive_stop_words_and_porter():
    assert analyze("The Women's Running Shoes are not for kids") == ["women", "run", "shoe", "kid"]
    # Porter as Lucene ports it: words of one or two letters are left alone
    assert analyze("us as is xl") == ["us", "xl"]


def test_length_norm_is_lucene_smallfloat():
    # SmallFloat.intToByte4: exact below 24, then 4 significant bits (rounded down)
    assert [norm_to_length(length_to_norm(n)) for n in (0, 5, 23, 24, 25, 40, 100, 1000)] == [
        0, 5, 23, 24, 25, 40, 96, 984]
    assert all(norm_to_length(length_to_norm(n)) <= n for n in range(5000))


def test_ties_are_broken_by_document_id():
    engine = LuceneBM25(["red shoe", "red shoe", "blue shoe"], ids=["B2", "B1", "B3"])
    assert engine.search("red shoe") == [1, 0, 2]
    with pytest.raises(ValueError):
        LuceneBM25(["a"], ids=["x", "y"])


def _lucene_reference(directory):
    queries = {}
    for line in open(directory / "lucene_oracle" / "queries.tsv", encoding="utf-8"):
        query_id, _kind, text = line.rstrip("\n").split("\t", 2)
        queries[query_id] = text
    top50 = {}
    for line in open(directory / "lucene_oracle" / "top50.tsv", encoding="utf-8"):
        query_id, *hits = line.rstrip("\n").split("\t")
        top50[query_id] = [hit.rsplit(":", 1)[0] for hit in hits if hit]
    return queries, top50


def test_rankings_agree_with_real_lucene():
    directory = require_data("webshop", "lucene_oracle/top50.tsv", "docs_1k.jsonl")
    from crl_envs.webshop.env import shared_resources

    res = shared_resources()
    asins = [p["asin"] for p in res.catalogue.products]
    queries, top50 = _lucene_reference(directory)
    assert len(queries) == 531
    top1 = set10 = order10 = 0
    for query_id, text in queries.items():
        got = [asins[i] for i in res.engine.search(text, k=50)]
        want = top50[query_id]
        top1 += got[:1] == want[:1]
        set10 += set(got[:10]) == set(want[:10])
        order10 += got[:10] == want[:10]
    n = len(queries)
    assert top1 / n >= 0.99 and set10 / n >= 0.99 and order10 / n >= 0.95, (top1, set10, order10)
