"""Sampling statistics for task shares: confidence intervals and a two-proportion test.

The samples of one PID form a multinomial over its tasks; the marginal of one task is binomial, so
a task's share gets the Wilson score interval of a binomial proportion (good also near 0 and 1).
Samples taken close together in time are correlated, so read these intervals as lower bounds.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054  # two-sided 95 % quantile of the standard normal


def _check(k: int, n: int) -> None:
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval (low, high) of the proportion k/n; (0, 0) when n == 0."""
    _check(k, n)
    if n == 0:
        return 0.0, 0.0
    p = k / n
    z2 = z * z
    denominator = 1 + z2 / n
    center = (p + z2 / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def share_ci95(k: int, n: int) -> float:
    """Half-width of the 95 % Wilson score interval of the share k/n (0.0 when n == 0).

    Wilson's interval is not centred on k/n; its half-width is (high - low) / 2, so a share is shown
    as ``k/n ± half-width`` with that caveat (it never reaches below 0 or above 1 in truth).
    """
    low, high = wilson_interval(k, n)
    return (high - low) / 2


def two_proportion_z(k1: int, n1: int, k2: int, n2: int) -> tuple[float, float]:
    """Pooled two-proportion z-test of k1/n1 against k2/n2: (z, two-sided p-value).

    z > 0 when the first share is larger. (0.0, 1.0) when a side has no samples or the pooled share
    is 0 or 1 (nothing to tell apart).
    """
    _check(k1, n1)
    _check(k2, n2)
    if n1 == 0 or n2 == 0:
        return 0.0, 1.0
    pooled = (k1 + k2) / (n1 + n2)
    variance = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if variance <= 0:
        return 0.0, 1.0
    z = (k1 / n1 - k2 / n2) / math.sqrt(variance)
    return z, math.erfc(abs(z) / math.sqrt(2))
