"""The gate's report: report.json, report.md, metrics.png, and the terminal text.

Decides how a :class:`~miles_amd.judge.gate.Verdict` is shown; it judges nothing. The renderers
are pure (verdict -> text); :func:`write_report` is the only function that writes, each file
atomically (temp file in the report dir + ``os.replace``), so a reader never sees half a
report.

- ``report.json``: ``verdict`` (``pass``/``fail``/``error``), ``reason``, ``exit_code``, the
  run and baseline, and one row per check (``name``, ``metric``, ``kind``, ``required``,
  ``status``, ``observed``, ``expected`` (the band or rule), ``detail``, ``rationale``,
  ``failing_steps``, ``numbers``), every sentinel hit, the metric sources, problems and
  conflicts. Strict JSON: non-finite numbers are written as miles' markers ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"``.
- ``report.md``: for a CI step summary: the verdict line first, then the checks with
  failures first (fail, error, then not measured, then pass), then every sentinel hit, then
  the evidence sources, problems and conflicts.
- ``metrics.png``: one panel per gated metric: the run's series, the baseline's series when
  it has one, the band of each mean/max rule, the spike threshold, failing points marked.
  matplotlib is imported inside :func:`plot_metrics` and drawn on the Agg canvas (headless,
  no pyplot state).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from miles_amd.baseline.model import Baseline
from miles_amd.evidence.types import RunEvidence
from miles_amd.judge.gate import Check, Verdict

Format = Literal["text", "json", "markdown"]

_STATUS_ORDER = {"fail": 0, "error": 1, "not_measured": 2, "pass": 3}
_STATUS_LABEL = {"fail": "FAIL", "error": "ERROR", "not_measured": "NOT MEASURED", "pass": "pass"}
_NONFINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    plot: Path


def ordered_checks(verdict: Verdict) -> list[Check]:
    """Failures first (fail, error), then not measured, then passes; stable within."""
    return sorted(verdict.checks, key=lambda c: _STATUS_ORDER[c.status])


# ---------------------------------------------------------------------------- json


def _json_number(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else _NONFINITE[value]
    return value


def _json_numbers(numbers: Mapping[str, float]) -> dict[str, object]:
    return {key: _json_number(value) for key, value in numbers.items()}


def to_json(verdict: Verdict) -> dict[str, object]:
    """The report as a JSON-ready dict (strict JSON, see the module doc)."""
    counts = {status: 0 for status in _STATUS_ORDER}
    for check in verdict.checks:
        counts[check.status] += 1
    return {
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "exit_code": verdict.exit_code,
        "run_dir": verdict.run_dir,
        "baseline": {
            "name": verdict.baseline_name,
            "path": verdict.baseline_path,
            "run_id": verdict.baseline_run_id,
        },
        "expected_rollouts": verdict.expected_rollouts,
        "counts": counts,
        "checks": [
            {
                "name": c.name,
                "metric": c.metric,
                "kind": c.kind,
                "required": c.required,
                "status": c.status,
                "observed": _json_number(c.observed),
                "expected": c.expected,
                "detail": c.detail,
                "rationale": c.rationale,
                "failing_steps": list(c.failing_steps),
                "numbers": _json_numbers(c.numbers),
            }
            for c in verdict.checks
        ],
        "sentinels": [
            {
                "name": h.name,
                "severity": h.severity,
                "count": h.count,
                "first_line": h.first_line,
                "first_text": h.first_text,
                "reference": h.reference,
            }
            for h in verdict.sentinels
        ],
        "evidence": {
            "sources": dict(sorted(verdict.sources.items())),
            "problems": [
                {"source": p.source, "path": p.path, "detail": p.detail} for p in verdict.problems
            ],
            "conflicts": [
                {
                    "metric": c.metric,
                    "step": c.step,
                    "values": {k: _json_number(v) for k, v in sorted(c.values.items())},
                }
                for c in verdict.conflicts
            ],
        },
    }


def render_json(verdict: Verdict) -> str:
    return json.dumps(to_json(verdict), indent=2, allow_nan=False) + "\n"


# ---------------------------------------------------------------------------- text


def _observed(check: Check) -> str:
    value = check.observed
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def _headline(verdict: Verdict) -> str:
    return (
        f"miles-amd gate: {verdict.verdict.upper()} - run {verdict.run_dir} against baseline "
        f"{verdict.baseline_name} ({verdict.baseline_run_id}), "
        f"{verdict.expected_rollouts} rollouts expected"
    )


def render_text(verdict: Verdict) -> str:
    """Plain text for the terminal, in the order of the markdown report."""
    lines = [_headline(verdict), verdict.reason, ""]
    checks = ordered_checks(verdict)
    width = max((len(c.name) for c in checks), default=10)
    for c in checks:
        lines.append(
            f"{_STATUS_LABEL[c.status]:<12}  {c.name:<{width}}  observed {_observed(c)}"
            f"  expected {c.expected}  - {c.detail}"
        )
    lines.append("")
    if verdict.sentinels:
        lines.append("sentinel hits:")
        for h in verdict.sentinels:
            ref = f" [{h.reference}]" if h.reference else ""
            lines.append(
                f"  {h.severity:<5}  {h.name}: {h.count}x, first at job.log:{h.first_line}{ref}"
            )
    else:
        lines.append("sentinel hits: none")
    for p in verdict.problems:
        lines.append(f"evidence problem: {p}")
    for c in verdict.conflicts:
        values = ", ".join(f"{k}={v!r}" for k, v in sorted(c.values.items()))
        lines.append(f"evidence conflict: {c.metric} at step {c.step}: {values}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- markdown


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_markdown(verdict: Verdict) -> str:
    """A reviewer's table: verdict line, failures first, sentinel hits, evidence."""
    lines = [
        f"**miles-amd gate: {verdict.verdict.upper()}** - run `{verdict.run_dir}` against "
        f"baseline `{verdict.baseline_name}` ({verdict.baseline_run_id}), "
        f"{verdict.expected_rollouts} rollouts expected",
        "",
        _cell(verdict.reason),
        "",
        "### Checks",
        "",
        "| status | check | metric | observed | expected | detail |",
        "|---|---|---|---|---|---|",
    ]
    for c in ordered_checks(verdict):
        required = "" if c.required else " (optional)"
        lines.append(
            f"| {_STATUS_LABEL[c.status]} | {_cell(c.name)}{required} | {_cell(c.metric or '')} "
            f"| {_cell(_observed(c))} | {_cell(c.expected)} | {_cell(c.detail)} |"
        )
    lines += ["", "### Sentinel hits", ""]
    if verdict.sentinels:
        lines += [
            "| sentinel | severity | count | first line | reference | first text |",
            "|---|---|---|---|---|---|",
        ]
        for h in verdict.sentinels:
            lines.append(
                f"| {_cell(h.name)} | {h.severity} | {h.count} | {h.first_line} "
                f"| {_cell(h.reference)} | {_cell(h.first_text[:160])} |"
            )
    else:
        lines.append("No sentinel hit in job.log.")
    lines += ["", "### Evidence", ""]
    if verdict.sources:
        lines += ["| metric | source |", "|---|---|"]
        lines += [f"| {_cell(m)} | {s} |" for m, s in sorted(verdict.sources.items())]
    else:
        lines.append("No metric was read.")
    lines.append("")
    if verdict.problems:
        lines.append("Problems:")
        lines += [f"- {_cell(p)}" for p in verdict.problems]
    else:
        lines.append("Problems: none.")
    if verdict.conflicts:
        lines.append("")
        lines.append("Conflicts:")
        for c in verdict.conflicts:
            values = ", ".join(f"{k}={v!r}" for k, v in sorted(c.values.items()))
            lines.append(f"- {_cell(c.metric)} at step {c.step}: {_cell(values)}")
    else:
        lines.append("Conflicts: none.")
    return "\n".join(lines) + "\n"


def render(verdict: Verdict, fmt: Format) -> str:
    if fmt == "json":
        return render_json(verdict)
    if fmt == "markdown":
        return render_markdown(verdict)
    return render_text(verdict)


# ---------------------------------------------------------------------------- plot


def _gated_metrics(baseline: Baseline) -> list[str]:
    metrics: list[str] = []
    for rule in baseline.rules:
        if rule.metric is not None and rule.metric not in metrics:
            metrics.append(rule.metric)
    return metrics


def _draw_panel(ax, metric: str, checks: list[Check], evidence: RunEvidence, baseline: Baseline):
    series = evidence.series.get(metric, ())
    failed = any(c.failed for c in checks)
    ax.set_title(metric, fontsize=9, color="tab:red" if failed else "black")
    ax.set_xlabel("train/step" if metric.startswith("train/") else "rollout/step", fontsize=8)
    ax.tick_params(labelsize=7)
    if metric in baseline.series:
        ref = baseline.series[metric]
        ax.plot(
            range(len(ref)),
            ref,
            color="0.55",
            linestyle="--",
            linewidth=1,
            label=f"baseline {baseline.run_id}",
        )
    finite = [(s, v) for s, v in series if math.isfinite(v)]
    if finite:  # a non-finite value is drawn as a gap in the line
        values = [v if math.isfinite(v) else math.nan for _, v in series]
        ax.plot([s for s, _ in series], values, marker="o", markersize=3, label="run")
    log_scale = False
    for c in checks:
        low, high = c.numbers.get("low"), c.numbers.get("high")
        if c.kind == "mean_within" and low is not None and high is not None:
            label = f"band for the mean ({c.name})"
            ax.axhspan(low, high, color="tab:green", alpha=0.15, label=label, gid=f"band:{c.name}")
            value = c.numbers.get("value")
            if value is not None and math.isfinite(value):
                ax.axhline(value, color="tab:green", linestyle=":", linewidth=1, label="run mean")
        elif c.kind == "max_within" and high is not None:
            ax.axhline(
                high, color="tab:orange", linestyle="--", linewidth=1, label="max bound", gid="max"
            )
        elif c.kind == "near_zero" and "atol" in c.numbers:
            atol = c.numbers["atol"]
            ax.axhspan(-atol, atol, color="tab:green", alpha=0.3, label=f"|value| ≤ {atol:g}")
        elif c.kind == "all_below" and "threshold" in c.numbers:
            threshold = c.numbers["threshold"]
            label = f"spike threshold {threshold:g}"
            ax.axhline(threshold, color="darkred", linewidth=1, label=label, gid="threshold")
            log_scale = all(v > 0 for _, v in finite)
    _mark_failing(ax, series, {step for c in checks for step in c.failing_steps})
    if log_scale:
        ax.set_yscale("log")
    if not series:
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
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6, loc="best")


def _mark_failing(ax, series, steps: set[int]) -> None:
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
        ax.annotate(
            _observed_value(v),
            (s, 0.9),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="tab:red",
            ha="center",
        )


def _observed_value(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def metrics_figure(verdict: Verdict, evidence: RunEvidence, baseline: Baseline):
    """The metrics figure (a matplotlib ``Figure`` on the Agg canvas), one panel a metric."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = _gated_metrics(baseline)
    columns = 2
    rows = max(1, math.ceil(len(metrics) / columns))
    figure = Figure(figsize=(6 * columns, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(_headline(verdict), fontsize=9)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, metric in zip(axes, metrics, strict=False):
        checks = [c for c in verdict.checks if c.metric == metric]
        _draw_panel(ax, metric, checks, evidence, baseline)
    for ax in axes[len(metrics) :]:
        ax.set_axis_off()
    return figure


def plot_metrics(verdict: Verdict, evidence: RunEvidence, baseline: Baseline, path: Path) -> None:
    """Draw every gated metric against its band into ``path`` (PNG, atomically)."""
    figure = metrics_figure(verdict, evidence, baseline)
    _atomic_write(path, lambda handle: figure.savefig(handle, format="png", dpi=90))


# ---------------------------------------------------------------------------- files


def _atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a report is for every reader of the dir
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_report(
    verdict: Verdict, evidence: RunEvidence, baseline: Baseline, out_dir: Path
) -> ReportFiles:
    """Write report.json, report.md and metrics.png into ``out_dir`` (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir / "report.json", out_dir / "report.md", out_dir / "metrics.png")
    json_text = render_json(verdict).encode("utf-8")
    _atomic_write(files.json, lambda handle: handle.write(json_text))
    md_text = render_markdown(verdict).encode("utf-8")
    _atomic_write(files.markdown, lambda handle: handle.write(md_text))
    plot_metrics(verdict, evidence, baseline, files.plot)
    return files
