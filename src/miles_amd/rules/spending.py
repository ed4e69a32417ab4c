"""Alpha spending over looks: how much of a rule's false-alarm rate each look may use.

Decides the spending function (Kim and DeMets' ``α·t^ρ``, ``RHO`` 3.5) and the upper z
boundaries that spend it under the canonical joint distribution (Armitage, McPherson and Rowe's
recursive integration on Jennison and Turnbull's grid, the root by ``scipy.optimize.brentq`` on
the log of the exit probability: exact at small alpha). A look below ``MIN_SPEND`` judges
nothing. ``docs/gate-and-statistics.md`` ("Spending over looks").
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from functools import lru_cache
from itertools import pairwise
from statistics import NormalDist

RHO = 3.5  # the power of the spending function (module doc)
MIN_SPEND = 1e-15  # a look that may spend less judges nothing
FRACTION_DIGITS = 2
_GRID_M = 10  # Jennison & Turnbull's m: 6m - 1 grid points a stage
_KERNEL_REACH = 8.5  # a normal kernel beyond 8.5 sd is below 2e-16 of its peak: skipped
_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_NORMAL = NormalDist()


def upper_tail(x: float) -> float:
    """``1 - Φ(x)``, accurate in the far tail (``erfc``)."""
    return 0.5 * math.erfc(x / _SQRT2)


def upper_quantile(p: float) -> float:
    """``x`` with ``1 - Φ(x) = p`` (``0 < p < 1``)."""
    return -_NORMAL.inv_cdf(p)


def spent(alpha: float, t: float) -> float:
    """The one-sided rate spent by information fraction ``t`` (module doc); 0 at ``t <= 0``."""
    if t <= 0.0:
        return 0.0
    if t >= 1.0:
        return alpha
    return alpha * t**RHO


def floor_fraction(t: float) -> float:
    """``t`` floored to :data:`FRACTION_DIGITS` decimals (1 stays 1)."""
    if t >= 1.0:
        return 1.0
    scale = 10**FRACTION_DIGITS
    return math.floor(t * scale + 1e-9) / scale


def _grid(sd: float, upper: float) -> tuple[list[float], list[float]]:
    m = _GRID_M
    xs = []
    for i in range(1, 6 * m):
        if i < m:
            x = -3.0 - 4.0 * math.log(m / i)
        elif i <= 5 * m:
            x = -3.0 + 3.0 * (i - m) / (2 * m)
        else:
            x = 3.0 + 4.0 * math.log(m / (6 * m - i))
        xs.append(sd * x)
    knots = [x for x in xs if x < upper]
    knots.append(upper if upper < xs[-1] else xs[-1])
    points, weights = [knots[0]], [0.0]
    for left, right in pairwise(knots):
        h = right - left
        points += [(left + right) / 2.0, right]
        weights[-1] += h / 6.0
        weights += [4.0 * h / 6.0, h / 6.0]
    return points, weights


def _exit(dens: list[float], points: list[float], b: float, sd: float) -> float:
    """``∫ g(u)·P(u + N(0, sd²) ≥ b) du`` over the grid (``dens`` holds weight x density)."""
    return math.fsum(g * upper_tail((b - u) / sd) for g, u in zip(dens, points, strict=True))


def _solve(dens: list[float], points: list[float], sd: float, target: float, guess: float):
    from scipy.optimize import brentq

    def excess(b: float) -> float:
        return math.log(_exit(dens, points, b, sd)) - math.log(target)

    lo, hi = guess - 12.0 * sd, guess + 1e-12
    if excess(hi) >= 0.0:
        return hi
    return float(brentq(excess, lo, hi, xtol=1e-13, rtol=1e-14, maxiter=200))


@lru_cache(maxsize=4096)
def boundaries(alpha: float, fractions: tuple[float, ...]) -> tuple[float | None, ...]:
    """The upper z boundary at each look (``None``: the look judges nothing), for a
    one-sided rate ``alpha`` spent by :func:`spent` at increasing information ``fractions``
    ending at 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return spend_boundaries(tuple(spent(alpha, t) for t in fractions), fractions)


def spend_boundaries(
    totals: tuple[float, ...], fractions: tuple[float, ...]
) -> tuple[float | None, ...]:
    """The upper z boundaries that spend the cumulative rates ``totals`` at the looks of
    information ``fractions`` (module doc: the recursive integration); any spending
    function's."""
    if (
        not fractions
        or len(totals) != len(fractions)
        or fractions[-1] != 1.0
        or not fractions[0] > 0.0
        or any(not a < b for a, b in pairwise(fractions))
        or any(not a <= b for a, b in pairwise(totals))
        or not 0.0 < totals[-1] < 1.0
    ):
        raise ValueError(f"information fractions must increase to 1, got {fractions}")
    out: list[float | None] = []
    points: list[float] = []
    dens: list[float] = []  # weight x continuation density at ``points`` (score scale)
    t_prev, spent_prev = 0.0, 0.0
    for index, (t, total) in enumerate(zip(fractions, totals, strict=True)):
        if total < MIN_SPEND or total <= spent_prev:
            out.append(None)
            continue
        sd_t = math.sqrt(t)
        guess = upper_quantile(total - spent_prev) * sd_t  # the marginal boundary
        if not points:  # the first judged look: the score is N(0, t), nothing crossed yet
            b = guess
        else:
            b = _solve(dens, points, math.sqrt(t - t_prev), total - spent_prev, guess)
        out.append(b / sd_t)
        if index + 1 < len(fractions):
            dens = _continuation(dens, points, t - t_prev, sd_t, b)
            points = _grid(sd_t, b)[0]
        t_prev, spent_prev = t, total
    return tuple(out)


def _continuation(
    dens: list[float], points: list[float], dt: float, sd_t: float, b: float
) -> list[float]:
    new_points, weights = _grid(sd_t, b)
    if not points:
        return [
            w * math.exp(-0.5 * (x / sd_t) ** 2) * _INV_SQRT_2PI / sd_t
            for x, w in zip(new_points, weights, strict=True)
        ]
    sd = math.sqrt(dt)
    reach, scale, exp = _KERNEL_REACH * sd, -0.5 / dt, math.exp
    out = []
    for x, w in zip(new_points, weights, strict=True):
        lo, hi = bisect_left(points, x - reach), bisect_right(points, x + reach)
        near = zip(dens[lo:hi], points[lo:hi], strict=True)
        # positive terms: a plain sum is within 1e-14 of math.fsum's, at a third of its cost
        total = sum([g * exp(scale * (x - u) ** 2) for g, u in near])
        out.append(w * _INV_SQRT_2PI / sd * total)
    return out
