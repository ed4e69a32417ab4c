"""Benchmark: the gate's honest false-alarm rate and its power (issue 19).

Honest: the reference is simulated too. Each replicate (``tests.support.honest``) draws
one prompt sequence, a simulated patched and a simulated stock reference on it (each one is
the other's ``cover`` run), records each with the real ``baseline record`` code
(``tests.support.calibrate.record``), and judges ``k`` simulated runs of that variant
with the real gate at N rollouts. The model adds to the fitted per-rollout noise
(``tests.support.simulate``) a run-level random effect and lag-1 autocorrelation, whose
sizes and how each was chosen from the published data (the two published runs' means,
jvvnhop9's per-rollout series, its KL summary; the example run is jvvnhop9 reconstructed,
no further data) are in ``tests.support.honest.Noise``:

- run effect: logprob gap 3% (two runs' means differ by 0.7%; 90% upper bound 3.5%), KL 6%
  (KL scales with the gap squared), reward 0.005 on every prompt's success probability
  (the stock mean's rounding; the two runs agree within half their binomial sd);
- lag-1 autocorrelation 0.3 (jvvnhop9's logprob series: -0.007, bias corrected +0.04,
  90% upper bound 0.33) on the logprob gap, the KL and the grad norm.

Besides the model's lognormal KL, a **skewed KL** (``c + LogNormal`` matching the published
KL min / mean / max) is a shape the model does not have.

Each rate is given with its 95% Clopper-Pearson interval on the effective count (runs judged
against one reference are correlated: Korn-Graubard, ``tests.support.intervals``). The
gate is the real one with the shipped rules (bands with the run effect and autocorrelation,
the one-sided pooled paired reward test with its binomial SE, the Hamed-Rao trend, the
second-half step rule with its pooled reference level, the KL level on the logarithms);
each simulated reference's ``pool`` values, like its ``cover`` values, are the simulated
other run's means.

Printed: the false alarms of both baselines at N = 20 with the checks that fail most; the
sensitivity table (run effect none / chosen / doubled x autocorrelation 0 / 0.3 / 0.5,
patched); the skewed-KL row; power against the regressions maintainers fear (reward halved
in the last third, logprob gap +25% from mid-run, reward -0.08 / -0.05, KL x2, spikes at 5%
and 10% of rollouts) for both baselines (the cross-run drift check's rates are
``benchmarks/bench_drift.py``'s). The last
line: ``honest_false_alarm_20=<rate> ci_high=<rate> power_late_collapse=<p>
power_step=<p> power_drop08=<p> power_drop05=<p> power_kl2=<p>`` (the patched baseline's
power; the false alarm of the worse of the two baselines). Exit 1 when that false alarm's
upper bound exceeds 1.5% (the goal: rate <= 1%, upper bound <= 1.5%, no check above 0.3%).

Run: ``python benchmarks/bench_calibration.py [--quick] [--workers 2]`` (full: about 4
minutes of CPU on each of 2 cores; ``--quick``: about 40 s of CPU, 1.5 minutes on a loaded
2-core machine: 1500 healthy runs a baseline, 200 a power cell, no sensitivity grid).
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

# ``python benchmarks/<name>.py`` puts benchmarks/ first on the path; tests.support needs the repo.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_amd.baseline.model import load_baseline
from tests.support import honest
from tests.support.calibrate import Cell, Tally, run_cell
from tests.support.intervals import clustered_interval

PER_REFERENCE = 5
GOAL_HIGH = 0.015
ROLLOUTS = 20


def _chunk(args: tuple[Cell, int, int]) -> Tally:
    cell, references, seed = args
    return run_cell(cell, references, seed)


def measure(pool: ProcessPoolExecutor, cell: Cell, references: int, seed: int) -> Tally:
    """``references`` replicates split over the pool's workers."""
    chunks = max(1, min(8, references // 25))
    sizes = [references // chunks + (i < references % chunks) for i in range(chunks)]
    jobs = [(cell, size, seed * 1000 + i) for i, size in enumerate(sizes)]
    total = Tally(cell.per_reference)
    for part in pool.map(_chunk, jobs):
        total = total.merge(part)
    return total


def _interval(failures: list[int]) -> str:
    rate, low, high = clustered_interval(failures, PER_REFERENCE)
    return f"{rate:.2%} [{low:.2%}, {high:.2%}]"


def _top(by_check: dict[str, int], runs: int) -> str:
    worst = sorted(by_check.items(), key=lambda kv: -kv[1])[:4]
    return ", ".join(f"{name} {count / runs:.2%}" for name, count in worst) or "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI mode: fewer replicates")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--references", type=int, help="healthy references per baseline")
    parser.add_argument("--power-references", type=int, help="references per power cell")
    args = parser.parse_args()
    healthy_refs, grid_refs, power_refs = (300, 0, 40) if args.quick else (1200, 200, 120)
    healthy_refs = args.references or healthy_refs
    power_refs = args.power_references or power_refs

    patched, stock = load_baseline("patched"), load_baseline("stock")
    model = honest.honest_model(patched, stock)
    templates = {"patched": patched, "stock": stock}
    summary: dict[str, float] = {}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = healthy_refs * PER_REFERENCE
        print(f"False alarms at N = {ROLLOUTS}: {runs} healthy runs, {PER_REFERENCE} per")
        print("recorded reference; 95% Clopper-Pearson on the effective count")
        print("| baseline | rate [95% CI] | most frequent failing checks |")
        print("|---|---|---|")
        worst = (-1.0, 0.0)
        for index, (name, template) in enumerate(templates.items()):
            cell = Cell(model, template, ROLLOUTS, PER_REFERENCE)
            tally = measure(pool, cell, healthy_refs, 1 + index)
            rate, _, high = clustered_interval(tally.failures, PER_REFERENCE)
            worst = max(worst, (rate, high))
            print(f"| {name} | {_interval(tally.failures)} | {_top(tally.by_check, tally.runs)} |")
            if tally.refused:
                print(f"(record refused {tally.refused} simulated {name} references)")
        summary["false_alarm"], summary["ci_high"] = worst

        skewed = replace(model, noise=replace(model.noise, kl_shape="skewed"))
        tally = measure(pool, Cell(skewed, patched, ROLLOUTS, PER_REFERENCE), healthy_refs // 2, 7)
        print()
        print(
            f"Skewed KL (c + LogNormal matching the published min/mean/max; patched, "
            f"{tally.runs} runs): {_interval(tally.failures)} ({_top(tally.by_check, tally.runs)})"
        )

        if grid_refs:
            print()
            runs = grid_refs * PER_REFERENCE
            print(f"Sensitivity (patched, N = {ROLLOUTS}, {runs} runs a cell): false alarms")
            print("| run effect | rho 0 | rho 0.3 | rho 0.5 |")
            print("|---|---|---|---|")
            for label, factor in (("none", 0.0), ("chosen", 1.0), ("doubled", 2.0)):
                cells = []
                for r_index, rho in enumerate((0.0, 0.3, 0.5)):
                    noise = replace(honest.CHOSEN.scaled(factor), rho=rho)
                    cell = Cell(replace(model, noise=noise), patched, ROLLOUTS, PER_REFERENCE)
                    tally = measure(pool, cell, grid_refs, 20 + 3 * int(factor * 2) + r_index)
                    cells.append(_interval(tally.failures))
                print(f"| {label} | {' | '.join(cells)} |")

        print()
        runs = power_refs * PER_REFERENCE
        print(f"Power at N = {ROLLOUTS} ({runs} runs a cell): fraction failed [95% CI]")
        print("| regression | patched | stock |")
        print("|---|---|---|")
        for f_index, fault in enumerate(honest.FEARED):
            cells = []
            for name, template in templates.items():
                cell = Cell(model, template, ROLLOUTS, PER_REFERENCE, fault)
                tally = measure(pool, cell, power_refs, 100 + 2 * f_index + (name == "stock"))
                cells.append(_interval(tally.failures))
                if name == "patched":
                    summary[fault.name] = tally.rate
            print(f"| {fault.name} | {' | '.join(cells)} |")

    print()
    print(
        f"honest_false_alarm_20={summary['false_alarm']:.4f} ci_high={summary['ci_high']:.4f} "
        f"power_late_collapse={summary['late_collapse']:.3f} power_step={summary['step']:.3f} "
        f"power_drop08={summary['drop08']:.3f} power_drop05={summary['drop05']:.3f} "
        f"power_kl2={summary['kl2']:.3f}"
    )
    return 1 if summary["ci_high"] > GOAL_HIGH else 0


if __name__ == "__main__":
    sys.exit(main())
