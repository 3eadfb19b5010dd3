"""Statistics over stored judgments: plain functions, tested with known values, used by
the pages, the API, the commands and the exports alike (never computed inside a judge)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# z for a two-sided 95% interval.
Z_95 = 1.959963984540054


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
