import pytest
from intervals import merge, total_length


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_merge_touching():
    assert merge([(1, 2), (2, 4)]) == [(1, 4)]


def test_merge_empty():
    assert merge([]) == []


def test_invalid_interval():
    with pytest.raises(ValueError):
        merge([(3, 1)])


def test_total_length():
    assert total_length([(1, 3), (2, 6)]) == 5
