"""Benchmark: the gate's honest false-alarm rate, its power, and the looks' node time (19, 27).

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

Sequential looks (issue 27): every run is judged as the gate judges by default, at the
baseline's looks (rollouts 6, 8, 10, 12, 14, 16, 20; ``miles_amd.rules.looks``), and the
same run at the end only (``--no-looks``), so the two columns differ by the looks alone; for
each red run the rollout it was decided at (``Verdict.decision``). ``--looks`` records and
judges with other looks (the boundaries re-derived at them by ``baseline record``), for
choosing looks on a ``--seed-offset`` seed set.

Printed: the false alarms of both baselines at N = 20, with looks and at the end only, with
the checks that fail most and how many red runs a look decided; the sensitivity table (run
effect none / chosen / doubled x autocorrelation 0 / 0.3 / 0.5, patched); the skewed-KL row;
power against the regressions maintainers fear (reward halved in the last third, logprob
gap +25% from mid-run, reward -0.08 / -0.05, KL x2, spikes at 5% and 10% of rollouts) for
both baselines, with looks and at the end only, and the rollouts to red (median / mean, red
runs per rollout); the node time of a red run (rollouts run before the stop over 20,
averaged over the red runs of each of :data:`NODE_TIME_FAULTS`, then over them; over
:data:`NAMED_FAULTS` alone beside it). The cross-
run drift check's rates are ``benchmarks/bench_drift.py``'s. The last line:
``honest_false_alarm_20=<rate> ci_high=<rate> power_late_collapse=<p> power_step=<p>
power_drop08=<p> power_drop05=<p> power_kl2=<p> looks_false_alarm=<rate>
looks_ci_high=<rate> median_red_kl2=<k> median_red_drop08=<k> median_red_step=<k>
node_time_red=<fraction>`` (``honest_false_alarm_20``/``ci_high``: at the end only; the
power: with looks, the patched baseline's; a false alarm: the worse of the two baselines).
Exit 1 when either false alarm's upper bound exceeds 1.5% (the goal: rate <= 1%, upper bound
<= 1.5%, no check above 0.3%). ``--seed-offset`` draws another seed set, for tuning a choice
on noise the reported figures do not use (the looks and the spending's power were chosen
with 50000).

Run: ``python benchmarks/bench_calibration.py [--quick] [--workers 2]`` (full: about 6
minutes of CPU; ``--quick``, run by CI through ``benchmarks/run_quick.py``: about 33 s of
CPU, 2000 healthy runs a baseline, 80 runs a power cell of the patched baseline only, 100
skewed-KL runs, no sensitivity grid; 10 runs a recorded reference, not 5: recording is most
of a replicate's CPU, and failures barely cluster by reference).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

# ``python benchmarks/<name>.py`` puts benchmarks/ first on the path; tests.support needs the repo.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_amd.baseline.model import load_baseline
from tests.support import honest
from tests.support.calibrate import Cell, Tally, run_cell
from tests.support.intervals import clustered_interval

PER_REFERENCE = 5
# quick: runs a recorded reference (recording is about 60% of a replicate's CPU with 5, and
# failures barely cluster by reference: the full run's clustered interval is the binomial one)
QUICK_PER_REFERENCE = 10
GOAL_HIGH = 0.015
ROLLOUTS = 20
# the regressions whose red runs' node time is averaged (the spikes are caught at once)
NODE_TIME_FAULTS = ("late_collapse", "step", "drop08", "drop05", "kl2")
# the three whose median rollouts to red issue 27 names: their average is printed beside
NAMED_FAULTS = ("kl2", "drop08", "step")


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


def _interval(failures: list[int], per: int) -> str:
    rate, low, high = clustered_interval(failures, per)
    return f"{rate:.2%} [{low:.2%}, {high:.2%}]"


def _top(by_check: dict[str, int], runs: int) -> str:
    worst = sorted(by_check.items(), key=lambda kv: -kv[1])[:4]
    return ", ".join(f"{name} {count / runs:.2%}" for name, count in worst) or "-"


def _median(values: list[int]) -> float:
    return statistics.median(values) if values else math.nan


def _mean(values: list[int]) -> float:
    return statistics.fmean(values) if values else math.nan


def _decided(tally: Tally) -> str:
    """Rollouts to red: median / mean, and how many red runs each look decided."""
    if not tally.decided:
        return "-"
    counts = Counter(tally.decided)
    by_look = ", ".join(f"{k}: {counts[k]}" for k in sorted(counts))
    return f"{_median(tally.decided):g} / {_mean(tally.decided):.1f} ({by_look})"


def _looks(text: str) -> tuple[int, ...]:
    """``--looks``: increasing rollouts ending at :data:`ROLLOUTS`."""
    try:
        looks = tuple(int(part) for part in text.split(","))
    except ValueError:
        looks = ()
    if not looks or looks[-1] != ROLLOUTS or any(not 0 < a < b for a, b in pairwise(looks)):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give increasing rollouts ending at {ROLLOUTS}, e.g. 5,10,15,20"
        )
    return looks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI mode: fewer replicates")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--references", type=int, help="healthy references per baseline")
    parser.add_argument("--power-references", type=int, help="references per power cell")
    parser.add_argument(
        "--seed-offset", type=int, default=0, help="another seed set (tuning, not reporting)"
    )
    parser.add_argument(
        "--looks",
        type=_looks,
        help="comma-separated looks ending at 20 in place of the baselines' (choosing looks)",
    )
    args = parser.parse_args()
    # quick (CI): the false alarms with a bound that can fail CI, a glance at the power
    healthy_refs, grid_refs, power_refs = (200, 0, 8) if args.quick else (1200, 200, 120)
    skewed_refs = 10 if args.quick else 600
    per = QUICK_PER_REFERENCE if args.quick else PER_REFERENCE
    healthy_refs = args.references or healthy_refs
    power_refs = args.power_references or power_refs
    offset = args.seed_offset

    patched, stock = load_baseline("patched"), load_baseline("stock")
    if args.looks is not None:  # record re-derives the boundaries at the template's looks
        patched, stock = (
            replace(b, run_shape=replace(b.run_shape, looks=args.looks)) for b in (patched, stock)
        )
    model = honest.honest_model(patched, stock)
    templates = {"patched": patched, "stock": stock}
    summary: dict[str, float] = {}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = healthy_refs * per
        print(f"False alarms at N = {ROLLOUTS}: {runs} healthy runs, {per} per")
        print("recorded reference, judged at the looks (the gate's default) and at the end only")
        print("(--no-looks); 95% Clopper-Pearson on the effective count")
        print("| baseline | with looks [95% CI] | at the end only | most frequent failing checks |")
        print("|---|---|---|---|")
        worst, worst_fixed = (-1.0, 0.0), (-1.0, 0.0)
        for index, (name, template) in enumerate(templates.items()):
            cell = Cell(model, template, ROLLOUTS, per)
            tally = measure(pool, cell, healthy_refs, offset + 1 + index)
            rate, _, high = clustered_interval(tally.failures, per)
            fixed, _, fixed_high = clustered_interval(tally.fixed, per)
            worst, worst_fixed = max(worst, (rate, high)), max(worst_fixed, (fixed, fixed_high))
            print(
                f"| {name} | {_interval(tally.failures, per)} | {_interval(tally.fixed, per)} "
                f"| {_top(tally.by_check, tally.runs)} |"
            )
            early = sum(1 for k in tally.decided if k < ROLLOUTS)
            print(f"(decided before rollout {ROLLOUTS}: {early} of {sum(tally.failures)} red)")
            if tally.refused:
                print(f"(record refused {tally.refused} simulated {name} references)")
        summary["looks_false_alarm"], summary["looks_ci_high"] = worst
        summary["false_alarm"], summary["ci_high"] = worst_fixed

        skewed = replace(model, noise=replace(model.noise, kl_shape="skewed"))
        cell = Cell(skewed, patched, ROLLOUTS, per)
        tally = measure(pool, cell, skewed_refs, offset + 7)
        print()
        print(
            f"Skewed KL (c + LogNormal matching the published min/mean/max; patched, "
            f"{tally.runs} runs): with looks {_interval(tally.failures, per)}, at the end only "
            f"{_interval(tally.fixed, per)} ({_top(tally.by_check, tally.runs)})"
        )

        if grid_refs:
            print()
            runs = grid_refs * per
            print(
                f"Sensitivity (patched, N = {ROLLOUTS}, {runs} runs a cell): false alarms with "
                "looks (at the end only)"
            )
            print("| run effect | rho 0 | rho 0.3 | rho 0.5 |")
            print("|---|---|---|---|")
            for label, factor in (("none", 0.0), ("chosen", 1.0), ("doubled", 2.0)):
                cells = []
                for r_index, rho in enumerate((0.0, 0.3, 0.5)):
                    noise = replace(honest.CHOSEN.scaled(factor), rho=rho)
                    cell = Cell(replace(model, noise=noise), patched, ROLLOUTS, per)
                    seed = offset + 20 + 3 * int(factor * 2) + r_index
                    tally = measure(pool, cell, grid_refs, seed)
                    cells.append(f"{_interval(tally.failures, per)} ({tally.fixed_rate:.2%})")
                print(f"| {label} | {' | '.join(cells)} |")

        print()
        runs = power_refs * per
        print(
            f"Power at N = {ROLLOUTS} ({runs} runs a cell): fraction failed [95% CI] with looks, "
            "at the end only, and rollouts to red with looks (median / mean; red runs per look)"
        )
        print(
            "| regression | patched, looks | patched, end only | patched, rollouts to red "
            "| stock, looks | stock, end only |"
        )
        print("|---|---|---|---|---|---|")
        node_time: dict[str, float] = {}
        for f_index, fault in enumerate(honest.FEARED):
            cells = []
            for name, template in templates.items():
                if args.quick and name == "stock":  # no paired or KL rule: power known ~0
                    cells += ["-", "-"]
                    continue
                cell = Cell(model, template, ROLLOUTS, per, fault)
                seed = offset + 100 + 2 * f_index + (name == "stock")
                tally = measure(pool, cell, power_refs, seed)
                cells += [_interval(tally.failures, per), _interval(tally.fixed, per)]
                if name == "patched":
                    cells.append(_decided(tally))
                    summary[fault.name] = tally.rate
                    summary[f"fixed_{fault.name}"] = tally.fixed_rate
                    summary[f"median_{fault.name}"] = _median(tally.decided)
                    if fault.name in NODE_TIME_FAULTS and tally.decided:
                        node_time[fault.name] = _mean(tally.decided) / ROLLOUTS
            print(f"| {fault.name} | {' | '.join(cells)} |")
        summary["node_time"] = statistics.fmean(node_time.values()) if node_time else math.nan
        named = [node_time[f] for f in NAMED_FAULTS if f in node_time]
        named_mean = statistics.fmean(named) if named else math.nan
        print()
        print(
            "Node time of a red run (rollouts run before the stop over "
            f"{ROLLOUTS}; start-up and the stop's seconds aside), patched, averaged over "
            f"{', '.join(NODE_TIME_FAULTS)}: {summary['node_time']:.3f} (over "
            f"{', '.join(NAMED_FAULTS)} alone: {named_mean:.3f}; "
            f"each: {', '.join(f'{f} {t:.3f}' for f, t in node_time.items())})"
        )

    print()
    print(
        f"honest_false_alarm_20={summary['false_alarm']:.4f} ci_high={summary['ci_high']:.4f} "
        f"power_late_collapse={summary['late_collapse']:.3f} power_step={summary['step']:.3f} "
        f"power_drop08={summary['drop08']:.3f} power_drop05={summary['drop05']:.3f} "
        f"power_kl2={summary['kl2']:.3f} "
        f"looks_false_alarm={summary['looks_false_alarm']:.4f} "
        f"looks_ci_high={summary['looks_ci_high']:.4f} "
        f"median_red_kl2={summary['median_kl2']:g} median_red_drop08={summary['median_drop08']:g} "
        f"median_red_step={summary['median_step']:g} node_time_red={summary['node_time']:.3f}"
    )
    return 1 if max(summary["ci_high"], summary["looks_ci_high"]) > GOAL_HIGH else 0


if __name__ == "__main__":
    sys.exit(main())
