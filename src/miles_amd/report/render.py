"""The gate's verdict as report.json, report.md and terminal text: the verdict first, then
failed, passed and not-measured checks, sentinel hits and evidence (text wrapped to 100
columns); a red stock run ROCm/aiter#5694 explains says so. Pure; strings from the run dir are
escaped for their sink. Explained in ``docs/cli.md`` ("The report").
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from miles_amd import escape
from miles_amd.judge.canary import REPRODUCED
from miles_amd.judge.gate import Check, Verdict
from miles_amd.rules.check import listed
from miles_amd.wrap import fit

Format = Literal["text", "json", "markdown"]
SCHEMA_VERSION = 3  # report.json's shape (report.schema.json, generated from report.schema)
SCHEMA_PATH = Path(__file__).resolve().parent / "report.schema.json"

_cell = escape.markdown
_STATUS_ORDER = {"fail": 0, "error": 1, "pass": 2, "not_measured": 3}
_STATUS_LABEL = {"fail": "FAIL", "error": "ERROR", "not_measured": "NOT MEASURED", "pass": "pass"}
_NONFINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}
_CHECK_FIELDS = ("name", "metric", "kind", "required", "status")  # report.json's order
_HIT_FIELDS = ("name", "severity", "count", "first_line", "first_text", "reference")


def ordered_checks(verdict: Verdict) -> list[Check]:
    return sorted(verdict.checks, key=lambda c: _STATUS_ORDER[c.status])


def _judged(verdict: Verdict) -> list[Check]:
    return [c for c in ordered_checks(verdict) if c.status != "not_measured"]


def not_measured_reasons(verdict: Verdict) -> list[tuple[str, str]]:
    """(the checks, why) per distinct reason (``detail``) of the checks not measured, the
    checks grouped as ``a (x, y); b (z)``."""
    by_reason: dict[str, dict[str, list[str]]] = {}
    for check in (c for c in verdict.checks if c.status == "not_measured"):
        head, _, tail = check.name.partition(".")
        by_reason.setdefault(check.detail or "no reason given", {}).setdefault(head, []).append(
            tail
        )
    return [
        ("; ".join(f"{h} ({', '.join(t)})" if any(t) else h for h, t in groups.items()), reason)
        for reason, groups in by_reason.items()
    ]


def verdict_sentence(verdict: Verdict) -> str:
    against = f"baseline {verdict.baseline_name} ({verdict.baseline_run_id})"
    measured = [c for c in verdict.checks if c.status != "not_measured"]
    if verdict.verdict == "error":
        return f"the gate could not judge this run: {verdict.reason}"
    if verdict.expected_failure is not None:
        return f"this run is NOT accepted, as expected: {verdict.expected_failure.line}"
    if verdict.verdict == "fail":
        failed = [c.name for c in verdict.checks if c.failed]
        decided = decision_text(verdict)
        return (
            f"this run is NOT accepted: {len(failed)} of {len(measured)} checks against "
            f"{against} failed ({listed(failed)})" + (f"; {decided}" if decided else "")
        )
    unmeasured = len(verdict.checks) - len(measured)
    tail = f"; {unmeasured} optional checks were not measured" if unmeasured else ""
    return f"this run is accepted: all {len(measured)} measured checks agree with {against}{tail}"


def decision_text(verdict: Verdict) -> str:
    """When a red run was decided: at a look, at a failing value, or at its end; "" for a pass."""
    decided = verdict.decision
    if decided is None:
        return ""
    of = f"rollout {decided.rollout} of {verdict.expected_rollouts}"
    if decided.at_look:
        alpha = f", α spent {decided.alpha_spent:.3g}" if decided.alpha_spent else ""
        return f"decided at the look at {of} by {decided.check}{alpha}"
    if decided.rollout < verdict.expected_rollouts:
        return f"decided at {of} by {decided.check}"
    return f"decided at its end ({of}) by {decided.check}"


def _json_number(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else _NONFINITE[value]
    return value


def to_json(verdict: Verdict) -> dict[str, object]:
    counts = {status: 0 for status in _STATUS_ORDER}
    for check in verdict.checks:
        counts[check.status] += 1
    decided = verdict.decision
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "summary": verdict_sentence(verdict),
        "exit_code": verdict.exit_code,
        "run_dir": verdict.run_dir,
        "baseline": {
            "name": verdict.baseline_name,
            "path": verdict.baseline_path,
            "run_id": verdict.baseline_run_id,
            "sha256": verdict.baseline_sha256,
            "shipped_sha256": verdict.shipped_sha256,
            "matches_shipped": verdict.matches_shipped,
        },
        "expected_rollouts": verdict.expected_rollouts,
        "looks": list(verdict.looks),
        "decided_at_rollout": decided.rollout if decided else None,
        "decided_by": decided.check if decided else None,
        "alpha_spent": _json_number(decided.alpha_spent) if decided else None,
        "expected_failure": None
        if (expected := verdict.expected_failure) is None
        else {"reason": REPRODUCED, "canary": expected.canary, "checks": list(expected.checks)},
        "counts": counts,
        "checks": [
            {
                **{key: getattr(c, key) for key in _CHECK_FIELDS},
                "observed": _json_number(c.observed),
                "expected": c.expected,
                "detail": c.detail,
                "rationale": c.rationale,
                "failing_steps": list(c.failing_steps),
                "numbers": {key: _json_number(value) for key, value in c.numbers.items()},
            }
            for c in verdict.checks
        ],
        "sentinels": [{key: getattr(h, key) for key in _HIT_FIELDS} for h in verdict.sentinels],
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


def _observed(check: Check) -> str:
    value = check.observed
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value)


def verdict_label(verdict: Verdict) -> str:
    expected = f" (expected: {REPRODUCED})" if verdict.expected_failure is not None else ""
    return verdict.verdict.upper() + expected


def baseline_identity(verdict: Verdict) -> str:
    if verdict.baseline_sha256 is None:
        return "baseline digest: not computed"
    name = verdict.baseline_name
    if verdict.shipped_sha256 is None:
        tail = f"no shipped baseline named {name} to compare with"
    elif verdict.matches_shipped:
        tail = f"matches the shipped {name}"
    else:
        tail = f"DIFFERS from the shipped {name} (sha256 {verdict.shipped_sha256[:16]})"
    return f"baseline sha256 {verdict.baseline_sha256[:16]}: {tail}"


def render_text(verdict: Verdict) -> str:
    lines = [
        f"miles-amd gate: {verdict_label(verdict)} - run {verdict.run_dir} against baseline "
        f"{verdict.baseline_name} ({verdict.baseline_run_id}), "
        f"{verdict.expected_rollouts} rollouts expected",
        f"{verdict.verdict.upper()}: {verdict_sentence(verdict)}",
        baseline_identity(verdict),
        "",
    ]
    checks = _judged(verdict)
    width = max((len(c.name) for c in checks), default=10)
    for c in checks:
        lines.append(
            f"{_STATUS_LABEL[c.status]:<5}  {c.name:<{width}}  observed {_observed(c)}"
            f"  expected {c.expected}  - {c.detail}"
        )
    if reasons := not_measured_reasons(verdict):
        lines += ["", "not measured (optional, so they do not change the verdict):"]
        lines += [f"  {names}: {why}" for names, why in reasons]
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
    for conflict in verdict.conflicts:
        values = ", ".join(f"{k}={v!r}" for k, v in sorted(conflict.values.items()))
        lines.append(f"evidence conflict: {conflict.metric} at step {conflict.step}: {values}")
    return fit((escape.terminal(line) for line in lines), indent=" " * 7)


def render_markdown(verdict: Verdict) -> str:
    lines = [
        f"**miles-amd gate: {verdict_label(verdict)}** - {_cell(verdict_sentence(verdict))}",
        "",
        f"Run {escape.markdown_code(verdict.run_dir)} against baseline "
        f"{escape.markdown_code(verdict.baseline_name)} ({_cell(verdict.baseline_run_id)}), "
        f"{verdict.expected_rollouts} rollouts expected. "
        f"{_cell(verdict.reason)}",
        "",
        _cell(baseline_identity(verdict)) + ".",
        "",
        "### Checks",
        "",
        "| status | check | metric | observed | expected | detail |",
        "|---|---|---|---|---|---|",
    ]
    for c in _judged(verdict):
        required = "" if c.required else " (optional)"
        lines.append(
            f"| {_STATUS_LABEL[c.status]} | {_cell(c.name)}{required} | {_cell(c.metric or '')} "
            f"| {_cell(_observed(c))} | {_cell(c.expected)} | {_cell(c.detail)} |"
        )
    if reasons := not_measured_reasons(verdict):
        lines += ["", "Not measured (optional, so they do not change the verdict):", ""]
        lines += [f"- {_cell(names)}: {_cell(why)}" for names, why in reasons]
    lines += ["", "### Sentinel hits", ""]
    if not verdict.sentinels:
        lines.append("No sentinel hit in job.log.")
    else:
        lines += [
            "| sentinel | severity | count | first line | reference | first text |",
            "|---|---|---|---|---|---|",
        ]
    lines += [
        f"| {_cell(h.name)} | {h.severity} | {h.count} | {h.first_line} "
        f"| {_cell(h.reference)} | {_cell(h.first_text[:160])} |"
        for h in verdict.sentinels
    ]
    lines += ["", "### Evidence", ""]
    if verdict.sources:
        lines += ["| metric | source |", "|---|---|"]
        lines += [f"| {_cell(m)} | {s} |" for m, s in sorted(verdict.sources.items())]
    else:
        lines.append("No metric was read.")
    lines.append("")
    if verdict.problems:
        lines += ["Problems:", *(f"- {_cell(p)}" for p in verdict.problems)]
    else:
        lines.append("Problems: none.")
    lines += ["", "Conflicts:"] if verdict.conflicts else ["Conflicts: none."]
    for conflict in verdict.conflicts:
        values = ", ".join(f"{k}={v!r}" for k, v in sorted(conflict.values.items()))
        lines.append(f"- {_cell(conflict.metric)} at step {conflict.step}: {_cell(values)}")
    return "\n".join(lines) + "\n"


def render(verdict: Verdict, fmt: Format) -> str:
    if fmt == "json":
        return render_json(verdict)
    if fmt == "markdown":
        return render_markdown(verdict)
    return render_text(verdict)
