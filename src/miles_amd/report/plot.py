"""Every PNG we draw: metrics.png (per gated metric the run's series, the published one, each
rule kind's hint, the failing points, the rollout a red run was decided at), compare.png (A and
B, Δ and its CI in the title) and the history's trend plot (run means ± 1 SE, a failed gate a
red cross). One panel a metric, at most two columns; the title one literal line (foreign text
escaped, cut at :data:`TITLE_LIMIT`); a note in a flat or all-non-finite panel; values beyond
±:data:`DRAW_LIMIT` drawn at the bound. matplotlib is imported lazily (Agg canvas).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from miles_amd.escape import terminal
from miles_amd.evidence.types import RunEvidence, Series
from miles_amd.judge.gate import Verdict
from miles_amd.report.render import verdict_sentence
from miles_amd.rules.check import Check, axis
from miles_amd.rules.model import Baseline, KindName

if TYPE_CHECKING:
    from miles_amd.history.drift import Drift
    from miles_amd.history.store import StoredRun
    from miles_amd.judge.compare import Comparison

DPI = 90
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 6.5, 3.4
TITLE_SIZE, PANEL_TITLE_SIZE, LABEL_SIZE, TICK_SIZE, LEGEND_SIZE, NOTE_SIZE = 12, 10, 9, 9, 8, 10
TITLE_LIMIT = 200
LEGEND_DROP = 2.2 * TICK_SIZE + 1.5 * LABEL_SIZE  # points: the tick labels and the x label
DRAW_LIMIT = 1e300
THRESHOLD_NEAR = 1.5  # a spike threshold is drawn as a line when within 1.5x the run's max

# each gated metric's unit (log-probabilities are natural logs: nats)
Y_LABELS = {
    "train/train_rollout_logprob_abs_diff": "|logprob train - rollout|\n(nats/token)",
    "rollout/raw_reward": "reward\n(fraction of 64 samples)",
    "train/train_rollout_kl": "KL train vs rollout\n(nats/token)",
    "rollout/response_len/mean": "mean response length\n(tokens)",
    "rollout/truncated_ratio": "truncated samples\n(fraction)",
    "train/pg_clipfrac": "clipped tokens\n(fraction)",
    "train/grad_norm": "gradient norm\n(L2)",
}


def new_figure(panels: int, title: str, colour: str = "black") -> tuple[Any, list[Any]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    count = max(1, panels)
    columns = 2 if count > 1 else 1
    rows = math.ceil(count / columns)
    size = (PANEL_WIDTH_IN * columns, PANEL_HEIGHT_IN * rows + 0.5)
    figure = Figure(figsize=size, dpi=DPI, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    text = figure.suptitle(one_line(title), fontsize=TITLE_SIZE, color=colour)
    room = 0.98 * size[0] * figure.dpi
    width = text.get_window_extent(canvas.get_renderer()).width
    if width > room:  # a long sentence: a smaller font, never below the legend's
        text.set_fontsize(max(LEGEND_SIZE, TITLE_SIZE * room / width))
    grid = figure.add_gridspec(rows, columns)
    axes = []
    for index in range(count):
        row, column = divmod(index, columns)
        last_alone = index == count - 1 and column == 0 and columns > 1
        axes.append(figure.add_subplot(grid[row, :] if last_alone else grid[row, column]))
    return figure, axes


def one_line(text: str, limit: int = TITLE_LIMIT) -> str:
    flat = terminal(" ".join(text.split()))
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return flat.replace("$", r"\$")


def _literal_lines(text: str) -> str:
    return "\n".join(terminal(line).replace("$", r"\$") for line in text.split("\n"))


def style_panel(ax: Any, title: str, xlabel: str, ylabel: str, title_colour: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_title(_literal_lines(title), fontsize=PANEL_TITLE_SIZE, color=title_colour)
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=TICK_SIZE)
    ax.yaxis.get_offset_text().set_fontsize(TICK_SIZE)
    ax.grid(True, color="0.9", linewidth=0.5)


def finish_panel(ax: Any, values: Sequence[float], noun: str = "values") -> None:
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
    """Why ``values`` do not read as a line (flat, or none finite); None when they do."""
    finite = [v for v in values if math.isfinite(v)]
    if values and not finite:
        return f"no finite value: all {len(values)} {noun} are NaN or inf"
    if len(finite) > 1 and min(finite) == max(finite):
        which = noun if len(finite) == len(values) else f"finite {noun}"
        return f"flat: all {len(finite)} {which} are {finite[0]:.6g}"
    return None


def draw_note(ax: Any, text: str, *, alone: bool = False) -> None:
    if alone:
        ax.set_axis_off()
    box = {"boxstyle": "round", "facecolor": "white", "edgecolor": "0.6", "alpha": 0.9}
    ax.text(
        0.5, 0.5, _literal_lines(text), transform=ax.transAxes, ha="center", va="center",
        fontsize=NOTE_SIZE, zorder=10, bbox=box, gid="note",
    )  # fmt: skip


def png_bytes(figure: Any) -> bytes:
    # drawn once and the pixels encoded (savefig draws twice under a layout engine)
    import io

    import numpy as np
    from matplotlib.image import imsave

    figure.canvas.draw()
    buffer = io.BytesIO()
    imsave(buffer, np.asarray(figure.canvas.buffer_rgba()), format="png", dpi=DPI)
    return buffer.getvalue()


def drawable_value(value: float) -> float:
    return max(-DRAW_LIMIT, min(DRAW_LIMIT, value)) if math.isfinite(value) else value


def threshold(ax: Any, check: Check, finite: list[float]) -> None:
    """A line when the data reach near it, else named in the legend."""
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


def metrics_figure(verdict: Verdict, evidence: RunEvidence, baseline: Baseline) -> Any:
    gated = list(dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None))
    measured = [m for m in gated if evidence.series.get(m)]
    unmeasured = [m for m in gated if m not in measured]
    colour = {"pass": "darkgreen", "fail": "tab:red", "error": "tab:red"}[verdict.verdict]
    run = verdict.run_dir.rstrip("/").rsplit("/", 1)[-1] or verdict.run_dir
    title = (
        f"{verdict.verdict.upper()}: {verdict_sentence(verdict)} "
        f"(run {run}, {verdict.expected_rollouts} rollouts expected)"
    )
    figure, axes = new_figure(len(measured), title, colour)
    early = verdict.decision
    decided = early.rollout if early and early.rollout < verdict.expected_rollouts else None
    for ax, metric in zip(axes, measured, strict=False):
        checks = [
            replace(c, numbers={k: drawable_value(v) for k, v in c.numbers.items()})
            for c in verdict.checks
            if c.metric == metric
        ]
        series = tuple((s, drawable_value(v)) for s, v in evidence.series[metric])
        _draw_panel(ax, metric, checks, series, baseline, decided)
    if not measured:
        draw_note(axes[0], "no gated metric was measured", alone=True)
    if unmeasured:
        figure.supxlabel(f"not measured (no data): {', '.join(unmeasured)}", fontsize=LABEL_SIZE)
    return figure


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
    failing = {s for c in checks for s in c.failing_steps}
    crosses = [(s, v) for s, v in series if s in failing and math.isfinite(v)]
    if crosses:
        ax.plot(*zip(*crosses, strict=True), linestyle="none", marker="x", color="tab:red",
                markersize=9, mew=2, label="failing", gid="failing")  # fmt: skip
    for s, v in series:
        if s in failing and not math.isfinite(v):
            ax.plot([s], [0.97], marker="v", color="tab:red", transform=ax.get_xaxis_transform())
            text = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
            ax.annotate(text, (s, 0.9), xycoords=("data", "axes fraction"), fontsize=TICK_SIZE,
                        color="tab:red", ha="center")  # fmt: skip
    if decided is not None:  # a dotted red line after the last step judged
        per = baseline.run_shape.train_steps_per_rollout if metric.startswith("train/") else 1
        ax.axvline(decided * per - 0.5, color="tab:red", linestyle=":", linewidth=1.5,
                   label=f"decided at rollout {decided}", gid="decided")  # fmt: skip
    finish_panel(ax, [v for _, v in series])


def metrics_png(verdict: Verdict, evidence: RunEvidence, baseline: Baseline) -> bytes:
    return png_bytes(metrics_figure(verdict, evidence, baseline))


def compare_figure(c: Comparison, a: RunEvidence, b: RunEvidence) -> Any:
    from miles_amd.report.compare_report import at_precision

    title = f"B {c.run_b} vs A {c.run_a}: Δ = B - A, paired by rollout"
    figure, axes = new_figure(len(c.diffs), title)
    for ax, d in zip(axes, c.diffs, strict=False):
        drawn: list[float] = []
        for label, run, style in (
            ("A", a, dict(color="tab:gray", linestyle="--", marker="s", markerfacecolor="none")),
            ("B", b, dict(color="tab:blue", marker="o")),
        ):
            values = run.series.get(d.metric, ())
            drawn += [v for _, v in values]
            points = [(s, v) for s, v in values if math.isfinite(v)]
            name = one_line(f"{label} {Path(run.run_dir).name}")  # foreign text
            ax.plot([s for s, _ in points], [v for _, v in points], markersize=3, label=name,
                    **style)  # fmt: skip
        style_panel(
            ax,
            f"{d.metric}\nΔ {at_precision(d.diff, d)}, 95% CI "
            f"[{at_precision(d.ci_low, d)}, {at_precision(d.ci_high, d)}]",
            axis(d.metric),
            Y_LABELS.get(d.metric, d.metric),
            "tab:red" if d.significant else "black",
        )
        finish_panel(ax, drawn, "values of A and B")
    if not c.diffs:
        draw_note(axes[0], "no metric logged by both runs", alone=True)
    return figure


def compare_png(c: Comparison, a: RunEvidence, b: RunEvidence) -> bytes:
    return png_bytes(compare_figure(c, a, b))


def trend_figure(runs: Sequence[StoredRun], found: Sequence[Drift]) -> Any:
    metrics = sorted({m for r in runs for m in r.summaries})
    drifted = {d.metric for d in found}
    title = f"run history: {len(runs)} run(s); mean per run ± 1 SE"
    figure, axes = new_figure(len(metrics), title)
    order = {r.run_id: i for i, r in enumerate(runs)}
    crowded = len(order) > 20  # each run named by its history id; more would crowd the axis
    for ax, metric in zip(axes, metrics, strict=False):
        drawn: list[float] = []
        for identity in sorted({r.identity.label() for r in runs}):
            points = [r for r in runs if r.identity.label() == identity and metric in r.summaries]
            if not points:
                continue
            xs = [order[r.run_id] for r in points]
            means = [drawable_value(r.summaries[metric].mean) for r in points]
            drawn += means
            errors = [
                drawable_value((r.summaries[metric].sd or 0.0) / math.sqrt(r.summaries[metric].n))
                for r in points
            ]
            ax.errorbar(xs, means, yerr=errors, marker="o", markersize=4, capsize=2, label=identity)
            failed = [
                (x, m) for x, m, r in zip(xs, means, points, strict=True) if r.verdict != "pass"
            ]
            if failed:
                ax.plot(*zip(*failed, strict=True), linestyle="none", marker="x", color="tab:red",
                        markersize=8, mew=2, label=f"{identity} failed gate")  # fmt: skip
        style_panel(
            ax,
            metric + ("  (drift)" if metric in drifted else ""),
            "run, oldest first" if crowded else "history run id (oldest first)",
            Y_LABELS.get(metric, metric),
            "tab:red" if metric in drifted else "black",
        )
        if not crowded:
            ax.set_xticks(list(order.values()), [str(r) for r in order])
        finish_panel(ax, drawn, "run means")
    if not metrics:
        draw_note(axes[0], "no run in the history", alone=True)
    return figure


def trend_png(runs: Sequence[StoredRun], found: Sequence[Drift]) -> bytes:
    return png_bytes(trend_figure(runs, found))
