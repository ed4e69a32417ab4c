"""Benchmark: the drift check's false-flag rate over a history's life, and its power.

The drift check (``miles_amd.history.drift``) runs a Mann-Kendall test on the last 12
trusted run means at every gate. Fixed seeds: the same command prints the same figures.

1. **Table** (``drift.LIFE_RATE``): for each ``|S|`` threshold, the fraction of simulated
   healthy histories of 100 runs (exchangeable run means: the test is rank-based, so any
   continuous distribution gives the same figure) in which any of the 89 looks reaches it,
   with a Wilson 95% interval; checks that the table's value lies in it, and that
   ``drift.mann_kendall`` gives the vectorised S used here.
2. **End to end**: healthy 100-run histories of 7 (patched) and 4 (stock) metrics, one
   failed gate (a wild value) every 10 runs, judged by ``drift.drifts`` at every append as
   the gate does: the fraction of histories ever flagged, against the Bonferroni bound
   ``metrics · drift.LIFE_RATE[threshold]``.
3. **Power** against a rise of +2% of the mean per run (run-mean coefficient of variation
   3.8%: the published within-run 2.3% of the logprob diff plus a 3% run-level effect; and
   2.3% without the run effect), at the patched threshold: flagged at the look that ends the
   12th rising run, and by the 20th.

Last line: ``drift_false_flag_100=<patched, end to end> ci_high=<its Wilson upper bound>
table_ok=<1|0> power_rise2_12=<p> power_rise2_by20=<p>``; exit 1 when the table disagrees
with its re-measurement (a value outside the Wilson interval) or an end-to-end rate is
measurably above ``drift.LIFE_ALPHA`` (the lower bound of its interval above it).

Run: ``python benchmarks/bench_drift.py [--quick]`` (full: 200,000 histories for the table,
about 4 minutes on one core; quick: 20,000 and fewer end-to-end histories, ~25 s).
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from miles_amd.history import drift
from miles_amd.history.store import StoredRun, Summary

SEED = 20261130
CV_RUN_EFFECT = math.hypot(0.0226, 0.03)  # within-run SE of the published series + run effect
CV_WITHIN = 0.0226
RISE = 0.02
PAIRS = np.triu_indices(drift.WINDOW, 1)


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def window_s(x: np.ndarray) -> np.ndarray:
    """Mann-Kendall S of every window of ``drift.WINDOW`` along axis 1."""
    w = sliding_window_view(x, drift.WINDOW, axis=1)
    return np.sign(w[..., PAIRS[1]] - w[..., PAIRS[0]]).sum(-1).astype(int)


def table(histories: int, rng: np.random.Generator) -> bool:
    maxima = np.concatenate(
        [
            np.abs(window_s(rng.random((min(10_000, histories), drift.LIFE_RUNS)))).max(1)
            for _ in range(max(1, histories // 10_000))
        ]
    )
    n = len(maxima)
    sample = rng.random((200, drift.WINDOW))
    agree = all(drift.mann_kendall(row.tolist()) == window_s(row[None])[0, 0] for row in sample)
    print(f"1. |S| thresholds over {n} healthy {drift.LIFE_RUNS}-run histories (window 12)")
    print("| |S| >= | measured per-metric life rate | Wilson 95% | table | in interval |")
    print("|---|---|---|---|---|")
    ok = agree
    for cutoff, tabled in drift.LIFE_RATE.items():
        hits = int((maxima >= cutoff).sum())
        low, high = wilson(hits, n)
        inside = low <= tabled <= high
        ok &= inside
        print(f"| {cutoff} | {hits / n:.5f} | {low:.5f}-{high:.5f} | {tabled} | {inside} |")
    print(f"drift.mann_kendall agrees with the vectorised S on 200 windows: {agree}")
    return ok


def stored(run_id: int, means: dict[str, float], verdict: str) -> StoredRun:
    return StoredRun(
        created_at="",
        recipe="gpt_oss_20b_lora",
        recipe_digest=None,
        variant="patched",
        aiter_commit=None,
        baseline="patched",
        image=None,
        commit_sha=None,
        run_dir="",
        verdict=verdict,
        reason="",
        rollouts=20,
        failed_checks=(),
        run_id=run_id,
        summaries={m: Summary(20, float(v), 0.0, float(v), float(v)) for m, v in means.items()},
    )


def end_to_end(metrics: int, histories: int, rng: np.random.Generator) -> tuple[int, int]:
    """Histories (of ``histories``) ever flagged by ``drift.drifts`` at some append."""
    names = [f"m{i}" for i in range(metrics)]
    cutoff = drift.threshold(metrics)
    flagged = 0
    for _ in range(histories):
        runs: list[StoredRun] = []
        for run_id in range(1, drift.LIFE_RUNS + 1):
            failed = run_id % 10 == 0
            values = rng.normal(1.0, 0.04, metrics) + (5.0 if failed else 0.0)
            runs.append(
                stored(run_id, dict(zip(names, values, strict=True)), "fail" if failed else "pass")
            )
            if drift.drifts(runs[-40:], cutoff):  # every append, as the gate checks
                flagged += 1
                break
    return flagged, histories


def power(cv: float, cutoff: int, histories: int, rng: np.random.Generator) -> tuple[float, float]:
    flat = 1.0 + rng.normal(0, cv, (histories, drift.WINDOW))
    rising = 1.0 + RISE * np.arange(1, 21) + rng.normal(0, cv, (histories, 20))
    s = np.abs(window_s(np.concatenate([flat, rising], axis=1)))  # looks end at runs 12..32
    at_12 = float((s[:, 12] >= cutoff).mean())  # the window of the 12 rising runs
    by_20 = float((s[:, 1:21] >= cutoff).any(axis=1).mean())  # looks after rising runs 1..20
    return at_12, by_20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer histories (CI)")
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    table_ok = table(20_000 if args.quick else 200_000, rng)
    print()
    print("2. End to end (drift.drifts at every append; a failed gate every 10th run)")
    above = False
    e2e_runs = 150 if args.quick else 1500
    for name, metrics in (("patched", 7), ("stock", 4)):
        hits, n = end_to_end(metrics, e2e_runs, rng)
        low, high = wilson(hits, n)
        if name == "patched":
            rate, ci_high = hits / n, high
        above |= low > drift.LIFE_ALPHA  # measurably above the stated life-time alpha
        cutoff = drift.threshold(metrics)
        print(
            f"{name}: {metrics} metrics, |S| >= {cutoff}: flagged "
            f"{hits}/{n} = {hits / n:.2%} (Wilson 95% {low:.2%}-{high:.2%}); "
            f"bound {metrics * drift.LIFE_RATE[cutoff]:.2%}"
        )
    print()
    cutoff = drift.threshold(7)
    print(f"3. Power against +{RISE:.0%} of the mean per run, |S| >= {cutoff}")
    results = {}
    for label, cv in (("with run effect", CV_RUN_EFFECT), ("within-run only", CV_WITHIN)):
        results[label] = power(cv, cutoff, 20_000, rng)
        at_12, by_20 = results[label]
        print(f"cv {cv:.1%} ({label}): at the 12th rising run {at_12:.1%}, by the 20th {by_20:.1%}")
    at_12, by_20 = results["with run effect"]
    ok = table_ok and not above
    print()
    print(
        f"drift_false_flag_100={rate:.4f} ci_high={ci_high:.4f} table_ok={int(table_ok)} "
        f"power_rise2_12={at_12:.3f} power_rise2_by20={by_20:.3f}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
