"""Distribution functions ``miles_amd.judge.compare`` needs: Student's t tail, binomial mass.

Thin wrappers over ``scipy.stats`` (imported lazily: the gate and the snapshot suite stay
light) that pin the edge cases ``compare`` relies on. It decides no threshold.
"""

from __future__ import annotations

import math


def t_two_sided_p(t: float, dof: int) -> float:
    """Two-sided p of Student's t with ``dof`` degrees of freedom; 1 for t = 0 or NaN."""
    if math.isnan(t):
        return 1.0
    from scipy.stats import t as student_t

    return float(2.0 * student_t.sf(abs(t), dof))


def binomial_pmf(k: int, n: int, p: float) -> float:
    """``P(X = k)`` for ``X ~ Binomial(n, p)``."""
    from scipy.stats import binom

    return float(binom.pmf(k, n, p))
