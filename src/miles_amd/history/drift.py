"""Cross-run drift: a metric whose run mean moved the same way in k consecutive runs.

Decides when slow drift across pull requests (each run a little worse, each still in band)
is flagged, and with which k. Pure: takes stored runs (oldest first), returns findings.

The rule: for each metric, take the run means of the last ``k + 1`` runs of one identity
(recipe, aiter variant, baseline); if all ``k`` moves between them go up (or all go down),
the metric has drifted. For healthy runs the run means are exchangeable, so each of the
``(k+1)!`` orders of ``k + 1`` distinct values is equally likely and a monotone run (up or
down) has probability ``2/(k+1)!`` whatever the metric's distribution. :func:`calibrated_k`
picks the smallest ``k`` that keeps the chance of any false flag over the metrics stored
for that identity at or below ``alpha`` (Bonferroni): ``2·metrics/(k+1)! <= alpha``; for the
7 gated metrics of the patched baseline at 1% that is k = 6 (0.28%; k = 5 would be 1.9%),
for the 3 metrics a run without KL/length logs has, k = 5 (0.83%).
``benchmarks/bench_calibration.py`` checks it on simulated healthy runs. A tie is no move.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from miles_amd.history.store import StoredRun

DRIFT_ALPHA = 0.01


def calibrated_k(metrics: int, alpha: float = DRIFT_ALPHA) -> int:
    """The smallest k with ``2·metrics/(k+1)! <= alpha`` (at least 2)."""
    k = 2
    while 2 * max(metrics, 1) / math.factorial(k + 1) > alpha:
        k += 1
    return k


@dataclass(frozen=True)
class Drift:
    metric: str
    direction: str  # "up" or "down"
    k: int
    means: tuple[float, ...]  # the last k + 1 run means, oldest first
    run_ids: tuple[int, ...]

    def sentence(self) -> str:
        values = " -> ".join(f"{m:.4g}" for m in self.means)
        runs = ", ".join(str(r) for r in self.run_ids)
        return (
            f"{self.metric} went {self.direction} in {self.k} consecutive runs "
            f"({values}; runs {runs})"
        )


def metric_count(runs: Sequence[StoredRun]) -> int:
    """How many metrics the drift check compares over ``runs`` (the Bonferroni count)."""
    return len({m for run in runs for m in run.summaries})


def drifts(runs: Sequence[StoredRun], k: int) -> list[Drift]:
    """Metrics whose mean moved the same way in each of the last ``k`` moves of ``runs``."""
    found = []
    metrics = sorted({m for run in runs for m in run.summaries})
    for metric in metrics:
        with_metric = [r for r in runs if metric in r.summaries][-(k + 1) :]
        if len(with_metric) < k + 1:
            continue
        means = tuple(r.summaries[metric].mean for r in with_metric)
        moves = [b - a for a, b in pairwise(means)]
        for direction, sign in (("up", 1), ("down", -1)):
            if all(sign * move > 0 for move in moves):
                ids = tuple(r.run_id for r in with_metric)
                found.append(Drift(metric, direction, k, means, ids))
    return found
