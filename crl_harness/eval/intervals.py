"""Success rates with their confidence intervals, alone and paired.

Holds:
- ``wilson_interval`` and ``format_rate``: a success rate's 95% Wilson interval and its text;
- ``PairedDifference`` / ``paired_difference``: two agents (or one before and after training) on
  the same levels, one episode each: the difference of their success rates with its 95% interval
  and McNemar's exact p; ``format_paired`` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["wilson_interval", "format_rate", "PairedDifference", "paired_difference",
           "format_paired"]


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial rate (sound at 0%, 100% and small n); it always
    holds the rate itself.

    Example:
        >>> [round(x, 3) for x in wilson_interval(20, 20)]
        [0.839, 1.0]
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # The interval holds p exactly; rounding can leave it a hair outside (6/6: 0.9999999999999999
    # as the upper end), which would make an error bar negative.
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def format_rate(successes: int, n: int) -> str:
    """A success rate with its 95% Wilson interval, in percent.

    Example:
        >>> format_rate(22, 64)
        '34.4% [23.9, 46.6] (22/64)'
    """
    low, high = wilson_interval(successes, n)
    rate = successes / n if n else 0.0
    return f"{100 * rate:.1f}% [{100 * low:.1f}, {100 * high:.1f}] ({successes}/{n})"


@dataclass(frozen=True)
class PairedDifference:
    """B's success rate minus A's over ``n`` pairs (the same level played once by each).

    Only the discordant pairs carry information: ``only_a`` (A won, B lost) and ``only_b``.
    With d = (only_b - only_a) / n, the 95% interval is d +- 1.96 * se, where
    se = sqrt(only_a + only_b - (only_b - only_a)^2 / n) / n (the Wald interval of a paired
    difference of proportions), and McNemar's exact p is the two-sided binomial test of only_b
    successes in only_a + only_b trials at 1/2.

    Example (22 against 20 wins on 64 levels, 6 won only after and 4 only before):
        >>> d = PairedDifference(n=64, a_wins=20, b_wins=22, only_a=4, only_b=6)
        >>> round(100 * d.difference, 1), [round(100 * x, 1) for x in d.interval]
        (3.1, [-6.5, 12.8])
        >>> round(d.mcnemar_p, 2)
        0.75
    """

    n: int
    a_wins: int
    b_wins: int
    only_a: int
    only_b: int

    @property
    def difference(self) -> float:
        return (self.only_b - self.only_a) / self.n if self.n else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        if not self.n:
            return -1.0, 1.0
        discordant = self.only_a + self.only_b
        se = math.sqrt(max(discordant - (self.only_b - self.only_a) ** 2 / self.n, 0.0)) / self.n
        return self.difference - 1.96 * se, self.difference + 1.96 * se

    @property
    def mcnemar_p(self) -> float:
        from scipy.stats import binomtest

        discordant = self.only_a + self.only_b
        return float(binomtest(self.only_b, discordant, 0.5).pvalue) if discordant else 1.0

    def to_dict(self) -> dict[str, float]:
        low, high = self.interval
        return {**asdict(self), "difference": self.difference, "ci_low": low, "ci_high": high,
                "mcnemar_p": self.mcnemar_p}


def paired_difference(a: Sequence[bool], b: Sequence[bool]) -> PairedDifference:
    """The ``PairedDifference`` of outcomes ``a[i]`` and ``b[i]`` on the same level ``i``.

    Example:
        >>> paired_difference([True, False, False], [True, True, False]).only_b
        1
    """
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need the same levels: {len(a)} against {len(b)}")
    return PairedDifference(
        n=len(a), a_wins=sum(map(bool, a)), b_wins=sum(map(bool, b)),
        only_a=sum(bool(x) and not y for x, y in zip(a, b, strict=True)),
        only_b=sum(bool(y) and not x for x, y in zip(a, b, strict=True)))


def format_paired(d: PairedDifference, a: str = "A", b: str = "B") -> str:
    """A paired difference in points with its 95% interval and McNemar's p; ``a`` and ``b``
    name the two sides.

    Example:
        >>> format_paired(PairedDifference(n=64, a_wins=20, b_wins=22, only_a=4, only_b=6),
        ...               "before", "after")
        '+3.1 points [-6.5, +12.8], McNemar p 0.75 (64 pairs; after alone won 6, before alone 4)'
        >>> format_paired(PairedDifference(n=0, a_wins=0, b_wins=0, only_a=0, only_b=0))
        'no pairs to compare (0 pairs)'
    """
    if d.n == 0:  # an interval of [-100, +100] would read as a measurement
        return "no pairs to compare (0 pairs)"
    low, high = d.interval
    return (f"{100 * d.difference:+.1f} points [{100 * low:+.1f}, {100 * high:+.1f}], McNemar p "
            f"{d.mcnemar_p:.2g} ({d.n} pairs; {b} alone won {d.only_b}, {a} alone {d.only_a})")
