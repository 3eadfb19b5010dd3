"""Statistics over stored judgments: plain functions, tested with known values, used by
the pages, the API, the commands and the exports alike (never computed inside a judge)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeVar

# z for a two-sided 95% interval.
Z_95 = 1.959963984540054

# Medians are taken of floats (seconds) and of Decimals (dollars), never of a mix.
N = TypeVar("N", float, Decimal)


@dataclass(frozen=True)
class Rate:
    """k of n, with its Wilson score interval (honest for small n: 3 of 3 is not 100%)."""

    successes: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float | None:
        return self.successes / self.n if self.n else None


def wilson_interval(successes: int, n: int, *, z: float = Z_95) -> Rate:
    """The Wilson score interval for a binomial proportion; (0, 1) when n is 0."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, not {successes} of {n}")
    if n == 0:
        return Rate(0, 0, 0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Rate(successes, n, max(0.0, centre - half), min(1.0, centre + half))


def median(values: Iterable[N | None]) -> N | float | None:
    """The middle value (the mean of the two middle ones for an even count).

    None when there are no values, or when any value is None: an unknown (a cost
    without a price) makes the median unknown, never a smaller number.
    """
    known = list(values)
    if not known or None in known:
        return None
    known.sort()
    middle = len(known) // 2
    if len(known) % 2:
        return known[middle]
    return (known[middle - 1] + known[middle]) / 2


def total(values: Iterable[Decimal | None]) -> Decimal | None:
    """The sum; None when any value is None (unknown, never counted as 0). 0 for none."""
    result = Decimal(0)
    for value in values:
        if value is None:
            return None
        result += value
    return result


# Dollars counted in millionths: costs have six decimal places (USD_DECIMAL_PLACES), so
# these integers are exact and add up without a Decimal per value.
MICRO_USD = 1_000_000


def _usd(micro: int) -> Decimal:
    return Decimal(micro).scaleb(-6)


def total_usd(values: Iterable[int | None]) -> Decimal | None:
    """The sum of amounts in millionths of a dollar, in dollars, exact; None when any is
    None (unknown, never counted as 0). 0 for none."""
    known = list(values)
    if None in known:
        return None
    return _usd(sum(known))


def median_usd(values: Iterable[int | None]) -> Decimal | None:
    """The median of amounts in millionths of a dollar, in dollars, exact (the mean of the
    two middle ones for an even count); None for none, or when any is None (as median)."""
    known = list(values)
    if not known or None in known:
        return None
    known.sort()
    middle = len(known) // 2
    if len(known) % 2:
        return _usd(known[middle])
    return _usd(known[middle - 1] + known[middle]) / 2


def mean(values: Iterable[float]) -> float | None:
    """The arithmetic mean; None for no values."""
    known = list(values)
    return sum(known) / len(known) if known else None


# Two scores this close are equal: they come from the same arithmetic on the same verdicts.
SCORE_TIE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Record:
    """One side's wins, ties and losses against another."""

    wins: int = 0
    ties: int = 0
    losses: int = 0

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses


def head_to_head(
    scores: Mapping[str, Mapping[Hashable, float]],
) -> dict[tuple[str, str], Record]:
    """Each ordered pair (a, b) of different models with requests in common: a's record
    against b over those requests, by score (higher wins, equal ties).

    `scores` maps a model to its score per request key; a pair without a request in
    common is left out (no record, rather than 0-0-0).
    """
    records: dict[tuple[str, str], Record] = {}
    models = list(scores)
    tolerance = SCORE_TIE_TOLERANCE
    # Each pair once: b's record against a is a's mirrored (its wins are a's losses).
    for index, a in enumerate(models):
        a_scores = scores[a]
        for b in models[index + 1 :]:
            b_scores = scores[b]
            # Look the smaller one's requests up in the larger (no set of the shared ones).
            mirrored = len(b_scores) < len(a_scores)
            few, many = (b_scores, a_scores) if mirrored else (a_scores, b_scores)
            wins = ties = losses = 0
            for key, score in few.items():
                other = many.get(key)
                if other is None:
                    continue
                difference = score - other
                if -tolerance <= difference <= tolerance:
                    ties += 1
                elif difference > 0:
                    wins += 1
                else:
                    losses += 1
            if not wins + ties + losses:
                continue
            if mirrored:
                wins, losses = losses, wins
            records[(a, b)] = Record(wins, ties, losses)
            records[(b, a)] = Record(losses, ties, wins)
    return records


def sign_test_p(wins: int, losses: int) -> float | None:
    """The exact two-sided sign test's p-value for `wins` against `losses` (ties left
    out): how likely a split at least this uneven is when neither side is better. None
    when there is nothing to test (no wins and no losses)."""
    if wins < 0 or losses < 0:
        raise ValueError(f"need counts >= 0, not {wins} and {losses}")
    n = wins + losses
    if n == 0:
        return None
    fewer = min(wins, losses)
    tail = sum(math.comb(n, k) for k in range(fewer + 1))
    return min(1.0, 2 * tail / 2**n)
