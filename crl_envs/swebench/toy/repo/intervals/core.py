"""Merging closed intervals given as (start, end) pairs."""


def merge(intervals):
    """Merge overlapping or touching closed intervals; return them sorted by start.

    >>> merge([(1, 3), (2, 6), (8, 10)])
    [(1, 6), (8, 10)]
    """
    merged = []
    for start, end in intervals:
        if start > end:
            raise ValueError(f"interval ({start}, {end}) has start > end")
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total_length(intervals):
    """The total length covered by the intervals, overlaps counted once."""
    return sum(end - start for start, end in merge(intervals))
