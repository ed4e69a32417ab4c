"""Cross-run drift: Mann-Kendall's ``S`` over the run means of the last :data:`WINDOW` trusted
runs of one identity, per metric; flagged at ``|S| >=`` :func:`threshold`, the smallest whose
chance of ever flagging a healthy :data:`LIFE_RUNS`-run history (:data:`LIFE_RATE`) times the
metrics is at most :data:`LIFE_ALPHA`. Error and power: ``docs/gate-and-statistics.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from miles_amd.history.store import StoredRun
from miles_amd.rules.kinds import mann_kendall_s as mann_kendall

WINDOW = 12
LIFE_RUNS = 100
LIFE_ALPHA = 0.05
# |S| threshold -> chance one metric of a healthy LIFE_RUNS-run history is ever flagged
LIFE_RATE: dict[int, float] = {
    48: 0.0354,
    50: 0.0175,
    52: 0.00791,
    54: 0.00345,
    56: 0.00125,
    58: 0.000445,
    60: 0.000135,
}


def threshold(metrics: int, alpha: float = LIFE_ALPHA) -> int:
    """The smallest tabled ``|S|`` with ``metrics · LIFE_RATE <= alpha`` (else the largest)."""
    fitting = [c for c, rate in LIFE_RATE.items() if max(metrics, 1) * rate <= alpha]
    return min(fitting) if fitting else max(LIFE_RATE)


@dataclass(frozen=True)
class Drift:
    metric: str
    direction: str  # "up" or "down"
    s: int
    threshold: int
    means: tuple[float, ...]  # the run means of the window, oldest first
    run_ids: tuple[int, ...]

    def sentence(self) -> str:
        first, last = self.means[0], self.means[-1]
        pairs = len(self.means) * (len(self.means) - 1) // 2
        return (
            f"{self.metric} trends {self.direction} over the last {len(self.means)} trusted "
            f"runs (Mann-Kendall S = {self.s:+d} of ±{pairs}, flag at |S| >= {self.threshold}; "
            f"{first:.4g} -> {last:.4g}; runs {self.run_ids[0]}..{self.run_ids[-1]})"
        )


def trusted(runs: Sequence[StoredRun]) -> list[StoredRun]:
    """Gate passes not marked untrusted; a run gated again (same ``run_key``) counts once."""
    kept = [r for r in runs if r.trusted]
    latest = {r.run_key: r.run_id for r in kept if r.run_key is not None}
    return [r for r in kept if r.run_key is None or latest[r.run_key] == r.run_id]


@dataclass(frozen=True)
class IdentityDrift:
    label: str
    trusted: int
    cutoff: int
    found: tuple[Drift, ...]


def by_identity(runs: Sequence[StoredRun]) -> list[IdentityDrift]:
    """The drift check of each identity among ``runs`` (first seen first), own threshold each."""
    checked = []
    for identity in dict.fromkeys(r.identity for r in runs):
        group = [r for r in runs if r.identity == identity]
        cutoff = threshold(metric_count(group))
        found = tuple(drifts(group, cutoff))
        checked.append(IdentityDrift(identity.label(), len(trusted(group)), cutoff, found))
    return checked


def metric_count(runs: Sequence[StoredRun]) -> int:
    return len({m for run in trusted(runs) for m in run.summaries})


def drifts(runs: Sequence[StoredRun], cutoff: int) -> list[Drift]:
    """Metrics whose last :data:`WINDOW` trusted run means reach ``|S| >= cutoff``."""
    found = []
    kept = trusted(runs)
    for metric in sorted({m for run in kept for m in run.summaries}):
        window = [r for r in kept if metric in r.summaries][-WINDOW:]
        if len(window) < WINDOW:
            continue
        means = tuple(r.summaries[metric].mean for r in window)
        s = mann_kendall(means)
        if abs(s) >= cutoff:
            ids = tuple(r.run_id for r in window)
            found.append(Drift(metric, "up" if s > 0 else "down", s, cutoff, means, ids))
    return found
