"""``miles-amd compare``'s words: compare.json, compare.md and the terminal text.

The statistics are ``miles_amd.judge.compare``'s: the warnings first, one line per metric (Δ =
B - A with its 95% CI, 0 below the data's :data:`PRECISION`, the effect size, the shift the
rollouts could detect), the spike counts with Fisher's exact p. The figure is
``miles_amd.report.plot``'s.
"""

from __future__ import annotations

import json
import math
from typing import Literal

from miles_amd import escape
from miles_amd.judge.compare import (
    ALPHA,
    MAX_SEARCH_ROLLOUTS,
    SPIKE_POWER,
    SPIKE_RATES,
    Comparison,
    MetricDiff,
    rate_ruled_out,
    rollouts_for_power,
)
from miles_amd.wrap import fit

Format = Literal["text", "json", "markdown"]


# a difference below this fraction of the metric's magnitude is shown as 0 (float32 rounding)
PRECISION = 1e-6


def _g(value: float) -> str:
    return f"{value:.4g}"


def at_precision(value: float, d: MetricDiff) -> str:
    scale = max(abs(d.mean_a), abs(d.mean_b))
    if math.isfinite(value) and abs(value) < PRECISION * scale:
        return "0"
    return f"{value:+.4g}"


def diff_sentence(d: MetricDiff) -> str:
    relative = f" ({d.relative:+.1%} of A)" if d.relative is not None else ""
    effect = f", d_z {d.d_z:+.2f}" if d.d_z is not None else ""
    floor = " (SE at the binomial floor)" if d.binomial_floor else ""
    p = f"p {d.p_value:.3g}, Holm-adjusted {d.p_holm:.3g}"
    verdict = f"differs ({p})" if d.significant else f"no detected difference ({p})"
    if at_precision(d.diff, d) == "0":
        relative, effect = "", ""
    ci = f"[{at_precision(d.ci_low, d)}, {at_precision(d.ci_high, d)}]"
    text = (
        f"Δ = {at_precision(d.diff, d)}{relative}, 95% CI {ci}{floor}{effect}: "
        f"{verdict}; with {d.n} paired rollouts this comparison could detect a shift of "
        f"±{_g(d.detectable)} (80% power, 5% two-sided)"
    )
    if d.undecided:
        text += (
            f"; the data cannot decide: the interval holds both no change and a shift of "
            f"±{_g(d.detectable)}"
        )
    return text


def spike_sentences(comparison: Comparison) -> list[str]:
    lines = []
    more = f"more than {MAX_SEARCH_ROLLOUTS}"
    needed = ", ".join(f"{r:.0%}: {rollouts_for_power(r) or more}" for r in SPIKE_RATES)
    for s in comparison.spikes:
        powers = ", ".join(f"{rate:.0%}: {s.power(rate):.0%}" for rate in SPIKE_RATES)
        line = (
            f"{s.metric} above {s.threshold:g}: A {s.count_a}/{s.n_a}, B {s.count_b}/{s.n_b} "
            f"rollouts (one-sided Fisher's exact p = {s.p_value:.3g} that B spikes less often "
            f"than A); power of this test if A spikes at a per-rollout rate of {powers} (B "
            f"never); rollouts each run needs for 95% power at {needed}"
        )
        if s.p_value > ALPHA and s.power(SPIKE_RATES[-1]) < SPIKE_POWER:
            line += (
                f"; the data cannot decide whether B spikes less often than A: "
                f"{s.n_a} vs {s.n_b} rollouts are too few"
            )
        for name, count, n in (("A", s.count_a, s.n_a), ("B", s.count_b, s.n_b)):
            if not count:
                line += (
                    f"; {name} with 0 spikes in {n} rollouts rules out a spike rate above "
                    f"{rate_ruled_out(n):.1%} per rollout (95%)"
                )
        lines.append(line)
    return lines


def to_json(c: Comparison) -> dict[str, object]:
    def number(v: float | None) -> object:
        return None if v is None or not math.isfinite(v) else v

    return {
        "run_a": c.run_a,
        "run_b": c.run_b,
        "baseline": c.baseline_name,
        "warnings": list(c.warnings),
        "metrics": [
            {
                "metric": d.metric,
                "n": d.n,
                "mean_a": d.mean_a,
                "mean_b": d.mean_b,
                "diff": d.diff,
                "se": d.se,
                "ci95": [d.ci_low, d.ci_high],
                "d_z": number(d.d_z),
                "relative": number(d.relative),
                "detectable_shift": d.detectable,
                "binomial_floor": d.binomial_floor,
                "p": d.p_value,
                "p_holm": d.p_holm,
                "significant": d.significant,
                "undecided": d.undecided,
                "summary": diff_sentence(d),
            }
            for d in c.diffs
        ],
        "spikes": [
            {
                "metric": s.metric,
                "threshold": s.threshold,
                "a": [s.count_a, s.n_a],
                "b": [s.count_b, s.n_b],
                "fisher_p_b_fewer": s.p_value,
                "power": {f"{rate:g}": s.power(rate) for rate in SPIKE_RATES},
                "rollouts_for_95pct_power": {
                    f"{rate:g}": rollouts_for_power(rate) for rate in SPIKE_RATES
                },
            }
            for s in c.spikes
        ],
        "not_paired": list(c.unpaired),
    }


def render_text(c: Comparison) -> str:
    lines = [
        f"miles-amd compare: B {c.run_b} vs A {c.run_a} (metrics of baseline {c.baseline_name})",
        *(f"WARNING: {w}" for w in c.warnings),
        "",
    ]
    for d in c.diffs:
        lines.append(f"{d.metric}: A {_g(d.mean_a)} -> B {_g(d.mean_b)}; {diff_sentence(d)}")
    lines += ["", *spike_sentences(c)]
    if c.unpaired:
        lines.append(f"not in both runs: {', '.join(c.unpaired)}")
    return fit(escape.terminal(line) for line in lines)


def render_markdown(c: Comparison) -> str:
    changed = [d.metric for d in c.diffs if d.significant]
    headline = (
        f"B differs from A in {len(changed)} of {len(c.diffs)} paired metrics "
        f"({', '.join(changed)})"
        if changed
        else f"no difference detected in {len(c.diffs)} paired metrics"
    )
    lines = [
        f"**miles-amd compare** - {headline}",
        "",
        f"A = {escape.markdown_code(c.run_a)}, B = {escape.markdown_code(c.run_b)}; metrics of "
        f"baseline {escape.markdown_code(c.baseline_name)}; "
        "Δ = B - A, paired by rollout.",
        "",
        *(f"> **Warning**: {escape.markdown(w)}" for w in c.warnings),
        *([""] if c.warnings else []),
        "| metric | n | mean A | mean B | Δ | 95% CI | d_z | detectable shift (80% power) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for d in c.diffs:
        d_z = "-" if d.d_z is None else f"{d.d_z:+.2f}"
        lines.append(
            f"| {d.metric} | {d.n} | {_g(d.mean_a)} | {_g(d.mean_b)} | {at_precision(d.diff, d)} "
            f"| [{at_precision(d.ci_low, d)}, {at_precision(d.ci_high, d)}] | {d_z} "
            f"| ±{_g(d.detectable)} |"
        )
    lines += ["", *(f"- {line}" for line in spike_sentences(c))]
    if c.unpaired:
        lines.append(f"- not in both runs: {escape.markdown(', '.join(c.unpaired))}")
    return "\n".join(lines) + "\n"


def render(c: Comparison, fmt: Format) -> str:
    if fmt == "json":
        return json.dumps(to_json(c), indent=2, allow_nan=False) + "\n"
    return render_markdown(c) if fmt == "markdown" else render_text(c)
