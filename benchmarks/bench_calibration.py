"""Benchmark: the gate's A/A false-alarm rate and its power, on simulated runs.

Simulates healthy runs of the recipe with ``miles_amd.testing.simulate`` (a noise model
fitted to the shipped baselines' published series and summaries; its module doc says what
is fitted from what) and judges each with the real gate (``miles_amd.judge.gate.judge``,
``expected_rollouts`` = N, so bands are rescaled as for a real run of N rollouts). Fixed
seeds: the same command prints the same tables.

1. **False alarms (A/A)**: the fraction of healthy runs the whole gate fails (any check),
   against the stock and the patched baseline, at N = 5, 10, 20, 40 rollouts, with the
   checks that failed them. Target: at most 1% at N = 20.
2. **Power**: the fraction of runs with an injected regression (``simulate.REGRESSIONS``:
   spikes at 5% / 10% of rollouts, logprob-diff mean +20% / +50%, reward -0.05 / -0.10,
   KL x2, a steady logprob-diff drift of ±2 sd inside the bands, a constant reward) the gate
   fails, against the patched baseline (the one with a per-rollout series, so every rule
   runs), at the same N; and the smallest N on a grid (5 .. 160) at which it fails at least
   95% of them (">160" when none does).

3. **Cross-run drift** (``miles_amd.history.drift``): ``k`` for the patched baseline's gated
   metrics, the fraction of ``--histories`` healthy histories of ``k + 1`` simulated runs the
   drift check flags (bound ``2·m/(k+1)!``), and the fraction it flags when the logprob-diff
   mean rises 2% per run (each run in band).

The last line reads ``false_alarm_20=<worst of the two baselines> power_spike05_20=...
power_spike10_20=... rollouts_for_95pct_spike10=<N>``.

Run: ``/work/venv/bin/python benchmarks/bench_calibration.py [--runs R] [--search-runs S]``
(defaults 4000 healthy runs per cell, 1000 per power cell, 400 per step of the N search;
about 3 minutes on one core).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from miles_amd.baseline.model import load_baseline
from miles_amd.history.drift import calibrated_k, drifts
from miles_amd.history.entry import gated_metrics
from miles_amd.history.store import StoredRun, summarize
from miles_amd.testing import simulate

SIZES = (5, 10, 20, 40)
SEARCH = (5, 10, 15, 20, 25, 30, 40, 50, 60, 80, 100, 120, 160)
TARGET_POWER = 0.95


def _top(by_check: dict[str, int], runs: int) -> str:
    worst = sorted(by_check.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{name} {count / runs:.2%}" for name, count in worst) or "-"


def drift_rate(model, metrics: list[str], k: int, histories: int, seed: int, rise: float) -> float:
    """Fraction of simulated histories of k + 1 runs the drift check flags."""
    rng = np.random.default_rng(seed)
    flagged = 0
    for _ in range(histories):
        values = model.simulate(k + 1, 20, rng)
        runs = []
        for run in range(k + 1):
            scale = {simulate.LOGPROB: 1.0 + rise * run}
            measured = {
                m: summarize(list(values[m][run] * scale.get(m, 1.0)))
                for m in metrics
                if m in values
            }
            summaries = {m: s for m, s in measured.items() if s is not None}
            runs.append(
                StoredRun(
                    created_at="",
                    recipe="",
                    variant="patched",
                    baseline="patched",
                    image=None,
                    commit_sha=None,
                    run_dir="",
                    verdict="pass",
                    reason="",
                    rollouts=20,
                    failed_checks=(),
                    run_id=run,
                    summaries=summaries,
                )
            )
        flagged += bool(drifts(runs, k))
    return flagged / histories


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4000, help="healthy runs per cell")
    parser.add_argument("--power-runs", type=int, default=1000, help="runs per power cell")
    parser.add_argument("--search-runs", type=int, default=400, help="runs per N searched")
    parser.add_argument("--histories", type=int, default=2000, help="histories for drift")
    args = parser.parse_args()

    patched, stock = load_baseline("patched"), load_baseline("stock")
    models = {
        "stock": (simulate.fit(patched, stock), stock),
        "patched": (simulate.fit(patched), patched),
    }

    print(f"A/A false alarms: fraction of {args.runs} healthy simulated runs the gate fails")
    columns = " | ".join(f"N={n}" for n in SIZES)
    print(f"| baseline | {columns} | most frequent failing checks at N=20 |")
    print(f"|---|{'---|' * len(SIZES)}---|")
    false_alarm_20 = 0.0
    for name, (model, baseline) in models.items():
        cells, top = [], "-"
        for index, n in enumerate(SIZES):
            out = simulate.gate_outcome(
                model, baseline, runs=args.runs, rollouts=n, seed=100 + index
            )
            cells.append(f"{out.rate:.2%}")
            if n == 20:
                false_alarm_20 = max(false_alarm_20, out.rate)
                top = _top(out.by_check, out.runs)
        print(f"| {name} | {' | '.join(cells)} | {top} |")

    model, baseline = models["patched"]
    print()
    print(
        f"Power: fraction of {args.power_runs} simulated runs with the regression the gate "
        "fails (patched baseline)"
    )
    print(f"| regression | {columns} | N for 95% |")
    print(f"|---|{'---|' * len(SIZES)}---|")
    power: dict[tuple[str, int], float] = {}
    needed: dict[str, str] = {}
    for r_index, regression in enumerate(simulate.REGRESSIONS):
        cells = []
        for index, n in enumerate(SIZES):
            out = simulate.gate_outcome(
                model,
                baseline,
                runs=args.power_runs,
                rollouts=n,
                seed=1000 + 10 * r_index + index,
                regression=regression,
            )
            power[regression.name, n] = out.rate
            cells.append(f"{out.rate:.1%}")
        needed[regression.name] = f">{SEARCH[-1]}"
        for s_index, n in enumerate(SEARCH):
            out = simulate.gate_outcome(
                model,
                baseline,
                runs=args.search_runs,
                rollouts=n,
                seed=5000 + 100 * r_index + s_index,
                regression=regression,
            )
            if out.rate >= TARGET_POWER:
                needed[regression.name] = str(n)
                break
        print(f"| {regression.name} | {' | '.join(cells)} | {needed[regression.name]} |")
    metrics = gated_metrics(baseline)
    k = calibrated_k(len(metrics))
    print()
    print(f"Cross-run drift over {len(metrics)} metrics: k = {k} consecutive same-way moves")
    healthy = drift_rate(model, metrics, k, args.histories, seed=9000, rise=0.0)
    rising = drift_rate(model, metrics, k, args.histories, seed=9001, rise=0.02)
    bound = 2 * len(metrics) / math.factorial(k + 1)
    print(
        f"healthy histories flagged: {healthy:.2%} (bound {bound:.2%}); "
        f"logprob mean +2% a run flagged: {rising:.1%} ({args.histories} histories of {k + 1} runs)"
    )
    print()
    print(
        f"false_alarm_20={false_alarm_20:.4f} power_spike05_20={power['spike05', 20]:.3f} "
        f"power_spike10_20={power['spike10', 20]:.3f} "
        f"rollouts_for_95pct_spike10={needed['spike10']}"
    )


if __name__ == "__main__":
    main()
