"""``metrics.png``: every measured gated metric of a run drawn against its baseline.

Decides the figure: one panel per metric a baseline rule names AND the run measured (an
unmeasured metric gets no empty panel: the figure's footer lists them in one line), with the
run's series (blue, solid, dots), the baseline's published series when it has one (black,
dashed, hollow squares, drawn above the run so it does not hide under it), each rule's hint
(its kind's hint in ``miles_amd.report.rule_hints``: a mean's band beside the series where
the mean is, a max bound, a spike threshold (a line when the data reach near it, else a
note, so the data are not squeezed into a strip), a ±atol strip, a Theil-Sen trend line),
and the failing points marked (a non-finite one as a labelled triangle at the top), and, for
a run decided red before its last rollout, a dotted red line after the rollout it was
decided at (``Verdict.decision``: a look, or a failing value). Every panel has its y label
with the unit (:data:`Y_LABELS`) and integer step ticks; a flat series or one with no finite
value carries a note saying so; a flat all-zero series is drawn last, in a small row
(``figure_layout.row_heights``). The title (one line) carries the verdict and its
plain-English sentence. Grid, sizes, legends and notes are ``figure_layout``'s (shared with
the compare and trend plots); matplotlib is drawn on the Agg canvas (headless, no pyplot
state); the PNG's bytes are returned, writing them is ``miles_amd.report.report``'s.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from miles_amd.evidence.types import RunEvidence, Series
from miles_amd.judge.gate import Verdict
from miles_amd.report.figure_layout import (
    LABEL_SIZE,
    TICK_SIZE,
    draw_note,
    legend_below,
    new_figure,
    panel_axes,
    png_bytes,
    series_note,
    style_panel,
)
from miles_amd.report.render import verdict_sentence
from miles_amd.report.rule_hints import HINTS
from miles_amd.rules.check import Check, axis
from miles_amd.rules.model import Baseline

# What each gated metric is, with its unit (log-probabilities are natural logs: nats).
Y_LABELS = {
    "train/train_rollout_logprob_abs_diff": "|logprob train - rollout|\n(nats/token)",
    "rollout/raw_reward": "reward\n(fraction of 64 samples)",
    "train/train_rollout_kl": "KL train vs rollout\n(nats/token)",
    "rollout/response_len/mean": "mean response length\n(tokens)",
    "rollout/truncated_ratio": "truncated samples\n(fraction)",
    "train/pg_clipfrac": "clipped tokens\n(fraction)",
    "train/grad_norm": "gradient norm\n(L2)",
}
RUN_COLOUR = "tab:blue"
BASELINE_COLOUR = "black"


def _gated_metrics(baseline: Baseline) -> list[str]:
    return list(dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None))


# Beyond this magnitude matplotlib's axis transform overflows and is singular (issue 26:
# +-1.7e308 in the CI history was a numpy LinAlgError); such values are drawn at the bound.
DRAW_LIMIT = 1e300


def drawable_value(value: float) -> float:
    """``value`` within +-:data:`DRAW_LIMIT` when finite (the figure only)."""
    return max(-DRAW_LIMIT, min(DRAW_LIMIT, value)) if math.isfinite(value) else value


def drawable(series: Series) -> Series:
    """``series`` with finite values clipped to +-:data:`DRAW_LIMIT` (the figure only; the
    report's numbers are the run's own)."""
    return tuple((s, drawable_value(v)) for s, v in series)


def drawable_check(check: Check) -> Check:
    """``check`` with its figures (the lines its hint draws) clipped like :func:`drawable`."""
    return replace(check, numbers={k: drawable_value(v) for k, v in check.numbers.items()})


def _draw_series(ax: Any, metric: str, series: Series, baseline: Baseline) -> None:
    if any(math.isfinite(v) for _, v in series):  # a non-finite value is a gap in the line
        values = [v if math.isfinite(v) else math.nan for _, v in series]
        steps = [s for s, _ in series]
        ax.plot(steps, values, color=RUN_COLOUR, marker="o", markersize=3, label="this run")
    if metric in baseline.series:
        ref = baseline.series[metric]
        ax.plot(
            range(len(ref)),
            ref,
            color=BASELINE_COLOUR,
            linestyle="--",
            linewidth=1,
            marker="s",
            markersize=4,
            markerfacecolor="none",
            alpha=0.8,
            zorder=3,
            label=f"baseline {baseline.run_id} (published)",
            gid="baseline",
        )


def _draw_panel(
    ax: Any,
    metric: str,
    checks: list[Check],
    series: Series,
    baseline: Baseline,
    decided: int | None = None,
):
    failed = any(c.failed for c in checks)
    ylabel = Y_LABELS.get(metric, metric)
    style_panel(ax, metric, axis(metric), ylabel, "tab:red" if failed else "black")
    _draw_series(ax, metric, series, baseline)
    finite = [v for _, v in series if math.isfinite(v)]
    log_scale = False
    for check in checks:
        hint = HINTS.get(check.kind)
        if hint is not None and check.numbers:
            log_scale = hint(ax, check, finite) or log_scale
    _mark_failing(ax, series, {step for c in checks for step in c.failing_steps})
    if log_scale:
        ax.set_yscale("log")
    if decided is not None:
        _mark_decided(ax, metric, baseline, decided)
    note = series_note([v for _, v in series])
    if note is not None:
        draw_note(ax, note)
    legend_below(ax)


def _mark_decided(ax: Any, metric: str, baseline: Baseline, rollout: int) -> None:
    """A dotted red line after the last step a run decided early had judged."""
    per = baseline.run_shape.train_steps_per_rollout if metric.startswith("train/") else 1
    ax.axvline(
        rollout * per - 0.5,
        color="tab:red",
        linestyle=":",
        linewidth=1.5,
        label=f"decided at rollout {rollout}",
        gid="decided",
    )


def _mark_failing(ax: Any, series: Series, steps: set[int]) -> None:
    """Red crosses on failing points; a non-finite one as a triangle at the top, labelled."""
    points = [(s, v) for s, v in series if s in steps]
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    if finite:
        ax.plot(
            [s for s, _ in finite],
            [v for _, v in finite],
            linestyle="none",
            marker="x",
            color="tab:red",
            markersize=9,
            mew=2,
            label="failing",
            gid="failing",
        )
    for s, v in points:
        if math.isfinite(v):
            continue
        ax.plot([s], [0.97], marker="v", color="tab:red", transform=ax.get_xaxis_transform())
        text = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        where = ("data", "axes fraction")
        ax.annotate(
            text, (s, 0.9), xycoords=where, fontsize=TICK_SIZE, color="tab:red", ha="center"
        )


def metrics_figure(verdict: Verdict, evidence: RunEvidence, baseline: Baseline):
    """The metrics figure (a matplotlib ``Figure`` on the Agg canvas), one panel a metric."""
    gated = _gated_metrics(baseline)
    measured = [m for m in gated if evidence.series.get(m)]
    unmeasured = [m for m in gated if m not in measured]
    colour = {"pass": "darkgreen", "fail": "tab:red", "error": "tab:red"}[verdict.verdict]
    # a flat all-zero series (the clip fraction of a healthy run) takes a small row, last
    flat_zero = {m for m in measured if all(v == 0 for _, v in evidence.series[m])}
    measured = [m for m in measured if m not in flat_zero] + [m for m in measured if m in flat_zero]
    small = [m in flat_zero for m in measured]
    figure = new_figure(len(measured), title(verdict), colour, small)
    early = verdict.decision
    decided = early.rollout if early and early.rollout < verdict.expected_rollouts else None
    axes = panel_axes(figure, len(measured), small)
    for ax, metric in zip(axes, measured, strict=False):
        checks = [drawable_check(c) for c in verdict.checks if c.metric == metric]
        _draw_panel(ax, metric, checks, drawable(evidence.series[metric]), baseline, decided)
    if not measured:
        axes[0].set_axis_off()
        draw_note(axes[0], "no gated metric was measured")
    if unmeasured:
        figure.supxlabel(f"not measured (no data): {', '.join(unmeasured)}", fontsize=LABEL_SIZE)
    return figure


def title(verdict: Verdict) -> str:
    """One line: the verdict, its sentence, the run's name and the rollouts expected."""
    run = verdict.run_dir.rstrip("/").rsplit("/", 1)[-1] or verdict.run_dir
    return (
        f"{verdict.verdict.upper()}: {verdict_sentence(verdict)} "
        f"(run {run}, {verdict.expected_rollouts} rollouts expected)"
    )


def metrics_png(verdict: Verdict, evidence: RunEvidence, baseline: Baseline) -> bytes:
    """The figure as PNG bytes."""
    return png_bytes(metrics_figure(verdict, evidence, baseline))
