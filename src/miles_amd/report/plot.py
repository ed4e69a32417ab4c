"""``metrics.png``: every gated metric of a run drawn against its baseline.

Decides the figure: one panel per metric a baseline rule names, with the run's series, the
baseline's series when it has one, each rule's hint (the ``plot`` its kind declares in
``miles_amd.judge.rules.KINDS``: a mean band, a max bound, a spike threshold, a ±atol
strip), and the failing points marked (a non-finite one as a labelled triangle at the top).
A metric with no series shows "not measured" and its expectations. matplotlib is imported
inside :func:`metrics_figure` and drawn on the Agg canvas (headless, no pyplot state); the
PNG's bytes are returned, writing them is ``miles_amd.report.report``'s.
"""

from __future__ import annotations

import io
import math
from typing import Any

from miles_amd.baseline.model import Baseline
from miles_amd.evidence.types import RunEvidence, Series
from miles_amd.judge.checks import axis
from miles_amd.judge.gate import Check, Verdict
from miles_amd.judge.rules import KINDS
from miles_amd.report.render import headline


def _gated_metrics(baseline: Baseline) -> list[str]:
    return list(dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None))


def _draw_series(ax: Any, metric: str, series: Series, baseline: Baseline) -> None:
    if metric in baseline.series:
        ref = baseline.series[metric]
        label = f"baseline {baseline.run_id}"
        ax.plot(range(len(ref)), ref, color="0.55", linestyle="--", linewidth=1, label=label)
    if any(math.isfinite(v) for _, v in series):  # a non-finite value is a gap in the line
        values = [v if math.isfinite(v) else math.nan for _, v in series]
        ax.plot([s for s, _ in series], values, marker="o", markersize=3, label="run")


def _draw_not_measured(ax: Any, checks: list[Check]) -> None:
    expectations = "\n".join(f"{c.name}: {c.expected}" for c in checks)
    ax.text(
        0.5,
        0.5,
        f"not measured\n{expectations}",
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=7,
        color="0.4",
    )
    ax.set_xticks([])
    ax.set_yticks([])


def _draw_panel(ax: Any, metric: str, checks: list[Check], series: Series, baseline: Baseline):
    ax.set_title(metric, fontsize=9, color="tab:red" if any(c.failed for c in checks) else "black")
    ax.set_xlabel(axis(metric), fontsize=8)
    ax.tick_params(labelsize=7)
    _draw_series(ax, metric, series, baseline)
    finite = [v for _, v in series if math.isfinite(v)]
    log_scale = False
    for check in checks:
        kind = KINDS.get(check.kind)
        if kind is not None and kind.plot is not None and check.numbers:
            log_scale = kind.plot(ax, check, finite) or log_scale
    _mark_failing(ax, series, {step for c in checks for step in c.failing_steps})
    if log_scale:
        ax.set_yscale("log")
    if not series:
        _draw_not_measured(ax, checks)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="best")


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
        ax.annotate(text, (s, 0.9), xycoords=where, fontsize=7, color="tab:red", ha="center")


def metrics_figure(verdict: Verdict, evidence: RunEvidence, baseline: Baseline):
    """The metrics figure (a matplotlib ``Figure`` on the Agg canvas), one panel a metric."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = _gated_metrics(baseline)
    columns = 2
    rows = max(1, math.ceil(len(metrics) / columns))
    figure = Figure(figsize=(6 * columns, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(headline(verdict), fontsize=9)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, metric in zip(axes, metrics, strict=False):
        checks = [c for c in verdict.checks if c.metric == metric]
        _draw_panel(ax, metric, checks, evidence.series.get(metric, ()), baseline)
    for ax in axes[len(metrics) :]:
        ax.set_axis_off()
    return figure


def metrics_png(verdict: Verdict, evidence: RunEvidence, baseline: Baseline) -> bytes:
    """The figure as PNG bytes (90 dpi)."""
    buffer = io.BytesIO()
    metrics_figure(verdict, evidence, baseline).savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()
