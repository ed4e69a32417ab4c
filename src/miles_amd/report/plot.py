"""Every PNG we draw: metrics.png here; compare.png and the history trend plot with its layout.

The layout (shared): the grid holds exactly the panels drawn (on two columns an odd last panel
spans its row; a row of ``small`` panels, a flat all-zero series, is :data:`SMALL_ROW` high);
nothing below :data:`LEGEND_SIZE` points at :data:`DPI`; the title is one literal line (newlines
folded, ``$`` not mathtext, control characters escaped, cut at :data:`TITLE_LIMIT`, its font
made smaller down to :data:`LEGEND_SIZE` when wider than the figure); each legend sits under
its panel; a flat series or one with no finite value carries a note saying so.

metrics.png: one panel per metric a baseline rule names AND the run measured (the footer lists
the unmeasured ones), the run's series (blue), the baseline's published one (black, dashed,
drawn above), each rule kind's hint (:data:`HINTS`: a mean's band beside the series where the
mean is, a max bound, a spike threshold (a line when the data reach near it, else a legend
note), a ±atol strip, a Theil-Sen trend line, a step's two halves), the failing points (a
non-finite one as a labelled triangle at the top) and, for a run decided red before its last
rollout, a dotted red line after the rollout it was decided at. Values beyond
±:data:`DRAW_LIMIT` are drawn at the bound (matplotlib's transform overflows; issue 26).
matplotlib is imported lazily and drawn on the Agg canvas; the PNG's bytes are returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from miles_amd.escape import terminal
from miles_amd.evidence.types import RunEvidence, Series
from miles_amd.judge.gate import Verdict
from miles_amd.report.render import verdict_sentence
from miles_amd.rules.check import Check, axis
from miles_amd.rules.model import Baseline, KindName

DPI = 90
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 6.5, 3.4
TITLE_SIZE, PANEL_TITLE_SIZE, LABEL_SIZE, TICK_SIZE, LEGEND_SIZE, NOTE_SIZE = 12, 10, 9, 9, 8, 10
TITLE_LIMIT = 200
LEGEND_DROP = 2.2 * TICK_SIZE + 1.5 * LABEL_SIZE  # points: the tick labels and the x label
SMALL_ROW = 0.55  # a row of flat all-zero panels, in panel heights (room for its legend)
DRAW_LIMIT = 1e300
THRESHOLD_NEAR = 1.5  # a spike threshold is drawn as a line when within 1.5x the run's max

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

# ---------------------------------------------------------------------------- layout


def columns_for(panels: int) -> int:
    return 2 if panels > 1 else 1


def row_heights(panels: int, small: Sequence[bool] = ()) -> list[float]:
    """Each grid row's height in panel heights: :data:`SMALL_ROW` when all its panels are
    ``small``, else 1."""
    count = max(1, panels)
    columns = columns_for(count)
    flags = list(small) + [False] * (count - len(small))
    return [
        SMALL_ROW if all(flags[row * columns : (row + 1) * columns]) else 1.0
        for row in range(math.ceil(count / columns))
    ]


def new_figure(panels: int, title: str, colour: str = "black", small: Sequence[bool] = ()) -> Any:
    """A figure on the Agg canvas sized for ``panels`` (at least one), titled in one line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = columns_for(panels)
    size = (PANEL_WIDTH_IN * columns, PANEL_HEIGHT_IN * sum(row_heights(panels, small)) + 0.5)
    figure = Figure(figsize=size, dpi=DPI, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    text = figure.suptitle(one_line(title), fontsize=TITLE_SIZE, color=colour)
    room = 0.98 * size[0] * figure.dpi
    width = text.get_window_extent(canvas.get_renderer()).width
    if width > room:  # a long sentence: a smaller font, never below the legend's
        text.set_fontsize(max(LEGEND_SIZE, TITLE_SIZE * room / width))
    return figure


def panel_axes(figure: Any, panels: int, small: Sequence[bool] = ()) -> list[Any]:
    """``panels`` axes filling the grid (one, the whole figure, for zero panels)."""
    count = max(1, panels)
    columns = columns_for(count)
    heights = row_heights(count, small)
    grid = figure.add_gridspec(len(heights), columns, height_ratios=heights)
    axes = []
    for index in range(count):
        row, column = divmod(index, columns)
        last_alone = index == count - 1 and column == 0 and columns > 1
        axes.append(figure.add_subplot(grid[row, :] if last_alone else grid[row, column]))
    return axes


def one_line(text: str, limit: int = TITLE_LIMIT) -> str:
    """``text`` as one literal line of at most ``limit`` characters (foreign text escaped)."""
    flat = terminal(" ".join(text.split()))
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return flat.replace("$", r"\$")


def literal_lines(text: str) -> str:
    return "\n".join(terminal(line).replace("$", r"\$") for line in text.split("\n"))


def style_panel(ax: Any, title: str, xlabel: str, ylabel: str, title_colour: str) -> None:
    """Title, axis labels, integer x ticks, tick sizes and a light grid."""
    from matplotlib.ticker import MaxNLocator

    ax.set_title(literal_lines(title), fontsize=PANEL_TITLE_SIZE, color=title_colour)
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=TICK_SIZE)
    ax.yaxis.get_offset_text().set_fontsize(TICK_SIZE)
    ax.grid(True, color="0.9", linewidth=0.5)


def finish_panel(ax: Any, values: Sequence[float], noun: str = "values") -> None:
    """The panel's note (:func:`series_note`) and its legend under the x label, two columns,
    :data:`LEGEND_DROP` points below the axes whatever their height."""
    from matplotlib.transforms import offset_copy

    note = series_note(values, noun)
    if note is not None:
        draw_note(ax, note)
    if ax.get_legend_handles_labels()[0]:
        below = offset_copy(ax.transAxes, fig=ax.figure, y=-LEGEND_DROP, units="points")
        ax.legend(
            fontsize=LEGEND_SIZE, loc="upper center", bbox_to_anchor=(0.5, 0.0),
            bbox_transform=below, ncols=2, frameon=False,
        )  # fmt: skip


def series_note(values: Sequence[float], noun: str = "values") -> str | None:
    """Why a panel's ``values`` do not read as a line: flat, or none finite; None when they do."""
    finite = [v for v in values if math.isfinite(v)]
    if values and not finite:
        return f"no finite value: all {len(values)} {noun} are NaN or inf"
    if len(finite) > 1 and min(finite) == max(finite):
        which = noun if len(finite) == len(values) else f"finite {noun}"
        return f"flat: all {len(finite)} {which} are {finite[0]:.6g}"
    return None


def draw_note(ax: Any, text: str) -> None:
    """``text`` boxed in the middle of the panel, above the data (gid ``note``)."""
    box = {"boxstyle": "round", "facecolor": "white", "edgecolor": "0.6", "alpha": 0.9}
    ax.text(
        0.5, 0.5, literal_lines(text), transform=ax.transAxes, ha="center", va="center",
        fontsize=NOTE_SIZE, zorder=10, bbox=box, gid="note",
    )  # fmt: skip


def empty(ax: Any, note: str) -> None:
    ax.set_axis_off()
    draw_note(ax, note)


def png_bytes(figure: Any) -> bytes:
    """The figure as PNG bytes: drawn once and the canvas's pixels encoded (``savefig`` would
    draw twice under a layout engine; the pixels are its own, checked by a test)."""
    import io

    import numpy as np
    from matplotlib.image import imsave

    figure.canvas.draw()
    buffer = io.BytesIO()
    imsave(buffer, np.asarray(figure.canvas.buffer_rgba()), format="png", dpi=DPI)
    return buffer.getvalue()


def drawable_value(value: float) -> float:
    """``value`` within +-:data:`DRAW_LIMIT` when finite (the figure only)."""
    return max(-DRAW_LIMIT, min(DRAW_LIMIT, value)) if math.isfinite(value) else value


# ---------------------------------------------------------------------------- rule hints
# (axes, the rule's check, the run's finite values); a check without the figures a hint
# needs (one decided by a non-finite value) draws nothing


def threshold(ax: Any, check: Check, finite: list[float]) -> None:
    """The spike threshold as a line when the data reach near it, else named in the legend
    with how far above the run's max it lies (a line far above would squeeze the data)."""
    limit = check.numbers.get("threshold")
    if limit is None:
        return
    top = max(finite, default=limit)
    if top <= 0 or limit <= THRESHOLD_NEAR * top:
        ax.axhline(limit, color="darkred", linewidth=1, label=f"spike threshold {limit:g}",
                   gid="threshold")  # fmt: skip
    else:
        note = f"spike threshold {limit:g}: off scale, {limit / top:.1f}x this run's max"
        ax.plot([], [], color="darkred", linewidth=1, label=note, gid="threshold")


def mean_band(ax: Any, check: Check, finite: list[float], what: str = "mean") -> None:
    """The band bounds the run's mean, not its points: an interval right of the series with
    the run's mean as a diamond on it."""
    low, high = check.numbers.get("low"), check.numbers.get("high")
    x = ax.dataLim.x1 + 1.5 if ax.has_data() else 0.0  # right of the series (and other bands)
    if low is not None and high is not None:
        label = f"band for the {what} ({check.name})"
        ax.fill_between([x - 0.35, x + 0.35], low, high, color="tab:green", alpha=0.3,
                        label=label, gid=f"band:{check.name}")  # fmt: skip
    value = check.numbers.get("value")
    if value is not None and math.isfinite(value):
        colour = "tab:red" if check.failed else "tab:green"
        ax.plot([x], [value], marker="D", color=colour, linestyle="none", label=f"run {what}")
    if low is not None and high is not None:
        ax.annotate(
            what, (x, high), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
            fontsize=LEGEND_SIZE, color="tab:green", gid=f"band-label:{check.name}",
        )  # fmt: skip


def max_bound(ax: Any, check: Check, finite: list[float]) -> None:
    if (high := check.numbers.get("high")) is not None:
        ax.axhline(high, color="tab:orange", linestyle="--", linewidth=1, label="max bound",
                   gid="max")  # fmt: skip


def near_zero(ax: Any, check: Check, finite: list[float]) -> None:
    if (atol := check.numbers.get("atol")) is not None:
        ax.axhspan(-atol, atol, color="tab:green", alpha=0.3, label=f"|value| ≤ {atol:g}")


def trend(ax: Any, check: Check, finite: list[float]) -> None:
    n = check.numbers
    if not {"first_step", "last_step", "slope", "intercept", "z"} <= n.keys():
        return
    first, last = n["first_step"], n["last_step"]
    ax.plot(
        [first, last], [n["intercept"] + n["slope"] * first, n["intercept"] + n["slope"] * last],
        color="tab:red" if check.failed else "tab:purple", linestyle="-.", linewidth=1,
        label=f"Theil-Sen trend (Z {n['z']:+.1f})", gid="trend",
    )  # fmt: skip


def step(ax: Any, check: Check, finite: list[float]) -> None:
    """``step_rise``: the two halves' geometric means as segments (red when it failed)."""
    n = check.numbers
    if "split_step" not in n:  # too few values to split
        return
    colour = "tab:red" if check.failed else "tab:brown"
    ax.plot([n["first_step"], n["split_step"]], [n["head"]] * 2, color=colour, linewidth=1.5,
            gid="step")  # fmt: skip
    ax.plot([n["split_step"], n["last_step"]], [n["tail"]] * 2, color=colour, linewidth=1.5,
            label=f"halves' geometric means (rise {n['z']:+.1f} SE)")  # fmt: skip


HINTS: Mapping[KindName, Callable[[Any, Check, list[float]], None]] = {
    "all_below": threshold,
    "mean_within": mean_band,
    "max_within": max_bound,
    "near_zero": near_zero,
    "no_rising_trend": trend,
    "step_rise": step,
    "log_mean_within": lambda ax, c, f: mean_band(ax, c, f, what="geometric mean"),
}

# ---------------------------------------------------------------------------- metrics.png


def _draw_panel(
    ax: Any, metric: str, checks: list[Check], series: Series, baseline: Baseline,
    decided: int | None,
) -> None:  # fmt: skip
    colour = "tab:red" if any(c.failed for c in checks) else "black"
    style_panel(ax, metric, axis(metric), Y_LABELS.get(metric, metric), colour)
    if any(math.isfinite(v) for _, v in series):  # a non-finite value is a gap in the line
        ax.plot([s for s, _ in series], [v if math.isfinite(v) else math.nan for _, v in series],
                color="tab:blue", marker="o", markersize=3, label="this run")  # fmt: skip
    if metric in baseline.series:
        ref = baseline.series[metric]
        ax.plot(
            range(len(ref)), ref, color="black", linestyle="--", linewidth=1, marker="s",
            markersize=4, markerfacecolor="none", alpha=0.8, zorder=3,
            label=f"baseline {baseline.run_id} (published)", gid="baseline",
        )  # fmt: skip
    finite = [v for _, v in series if math.isfinite(v)]
    for check in checks:
        hint = HINTS.get(check.kind)
        if hint is not None and check.numbers:
            hint(ax, check, finite)
    _mark_failing(ax, series, {s for c in checks for s in c.failing_steps})
    if decided is not None:  # a dotted red line after the last step judged
        per = baseline.run_shape.train_steps_per_rollout if metric.startswith("train/") else 1
        ax.axvline(decided * per - 0.5, color="tab:red", linestyle=":", linewidth=1.5,
                   label=f"decided at rollout {decided}", gid="decided")  # fmt: skip
    finish_panel(ax, [v for _, v in series])


def _mark_failing(ax: Any, series: Series, steps: set[int]) -> None:
    """Red crosses on failing points; a non-finite one as a triangle at the top, labelled."""
    points = [(s, v) for s, v in series if s in steps]
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    if finite:
        ax.plot([s for s, _ in finite], [v for _, v in finite], linestyle="none", marker="x",
                color="tab:red", markersize=9, mew=2, label="failing", gid="failing")  # fmt: skip
    for s, v in points:
        if not math.isfinite(v):
            ax.plot([s], [0.97], marker="v", color="tab:red", transform=ax.get_xaxis_transform())
            text = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
            ax.annotate(text, (s, 0.9), xycoords=("data", "axes fraction"), fontsize=TICK_SIZE,
                        color="tab:red", ha="center")  # fmt: skip


def metrics_figure(verdict: Verdict, evidence: RunEvidence, baseline: Baseline) -> Any:
    """The metrics figure (a matplotlib ``Figure`` on the Agg canvas), one panel a metric."""
    gated = list(dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None))
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
        checks = [
            replace(c, numbers={k: drawable_value(v) for k, v in c.numbers.items()})
            for c in verdict.checks
            if c.metric == metric
        ]
        series = tuple((s, drawable_value(v)) for s, v in evidence.series[metric])
        _draw_panel(ax, metric, checks, series, baseline, decided)
    if not measured:
        empty(axes[0], "no gated metric was measured")
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
    return png_bytes(metrics_figure(verdict, evidence, baseline))
