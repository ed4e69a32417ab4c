"""``miles-amd history``'s listing (text, JSON, markdown): one row a run, oldest first, with
its verdict, the baseline that judged it, its identity, ``run_key`` and the run means of the
shown metrics; then each identity's drift lines with its own trusted-run count and threshold.
Stored strings are escaped for their sink.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from miles_amd import escape, numeric
from miles_amd.history.drift import WINDOW, Drift, IdentityDrift
from miles_amd.history.store import StoredRun

_md = escape.markdown
SHOWN = ("train/train_rollout_logprob_abs_diff", "rollout/raw_reward")


def _row(run: StoredRun) -> list[str]:
    untrusted = run.verdict == "pass" and run.marked_untrusted
    means = (run.summaries.get(m) for m in SHOWN)
    return [
        str(run.run_id),
        run.created_at,
        "PASS UNTRUSTED" if untrusted else run.verdict.upper(),
        run.baseline,
        run.identity.label(),
        run.run_key or "-",
        (run.commit_sha or "-")[:12],
        *("-" if summary is None else f"{summary.mean:.4g}" for summary in means),
        run.run_dir,
    ]


HEADERS = ("id", "gated at", "verdict", "baseline", "identity", "run (job:evidence)", "commit")


def render_text(runs: Sequence[StoredRun], checked: Sequence[IdentityDrift]) -> str:
    if not runs:
        return "no run in the history\n"
    header = [*HEADERS, *(f"mean {m.rsplit('/', 1)[-1]}" for m in SHOWN), "run dir"]
    rows = [header, *(_row(run) for run in runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [f"{len(runs)} run(s), oldest first; mean of {', '.join(SHOWN)}"]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    lines.append("")
    lines += identity_drift_lines(checked)
    return "\n".join(escape.terminal(line) for line in lines) + "\n"


def identity_drift_lines(checked: Sequence[IdentityDrift]) -> list[str]:
    lines = []
    for group in checked:
        prefix = f"[{group.label}] " if len(checked) > 1 else ""
        lines += [prefix + line for line in drift_lines(group.found, group.cutoff, group.trusted)]
    return lines


def drift_lines(found: Sequence[Drift], cutoff: int, trusted: int | None = None) -> list[str]:
    if trusted is not None and trusted < WINDOW:
        return [
            f"drift: not checked yet ({trusted} trusted run(s) of this recipe and aiter build; "
            f"the trend test needs {WINDOW})"
        ]
    if not found:
        return [
            f"drift: no trend over the last {WINDOW} trusted runs (Mann-Kendall |S| < {cutoff})"
        ]
    return [f"DRIFT: {d.sentence()}" for d in found]


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    if high == low:
        return SPARKS[3] * len(values)
    top = len(SPARKS) - 1
    return "".join(SPARKS[round(numeric.position(v, low, high) * top)] for v in values)


def trend_table(runs: Sequence[StoredRun]) -> list[str]:
    """One sparkline of the run means per metric and identity (markdown shows no PNG)."""
    lines = [
        "| metric | variant/baseline | run mean, oldest → newest | last | min | max |",
        "|---|---|---|---|---|---|",
    ]
    for metric in sorted({m for r in runs for m in r.summaries}):
        for identity in dict.fromkeys(r.identity.label() for r in runs):
            means = [
                r.summaries[metric].mean
                for r in runs
                if r.identity.label() == identity and metric in r.summaries
            ]
            if means:
                lines.append(
                    f"| {_md(metric)} | {_md(identity)} | `{sparkline(means)}` | {means[-1]:.4g} "
                    f"| {min(means):.4g} | {max(means):.4g} |"
                )
    return lines


def render_markdown(runs: Sequence[StoredRun], checked: Sequence[IdentityDrift]) -> str:
    header = [*HEADERS, *(f"mean {m}" for m in SHOWN), "run dir"]
    lines = [
        "### Run history",
        "",
        "| " + " | ".join(_md(h) for h in header) + " |",
        "|" + "---|" * len(header),
    ]
    for run in runs:
        lines.append("| " + " | ".join(_md(cell) for cell in _row(run)) + " |")
    drift = [f"- {_md(line)}" for line in identity_drift_lines(checked)]
    return "\n".join([*lines, "", *trend_table(runs), "", *drift]) + "\n"


# the JSON listing's keys of a run, in order (then failed_checks and summaries)
_JSON_FIELDS = (
    *("run_id", "created_at", "recipe", "recipe_digest", "variant", "aiter_commit", "trusted"),
    *("marked_untrusted", "baseline", "image", "commit_sha", "run_dir", "run_key", "verdict"),
    *("reason", "rollouts"),
)


def to_json(runs: Sequence[StoredRun], checked: Sequence[IdentityDrift]) -> str:
    def number(v: float | None) -> float | None:
        return v if v is not None and math.isfinite(v) else None

    doc = {
        "runs": [
            {
                **{key: getattr(r, key) for key in _JSON_FIELDS},
                "failed_checks": list(r.failed_checks),
                "summaries": {
                    m: {"n": s.n, "mean": s.mean, "sd": number(s.sd), "min": s.min, "max": s.max}
                    for m, s in sorted(r.summaries.items())
                },
            }
            for r in runs
        ],
        "drift": {
            "window": WINDOW,
            "identities": [
                {
                    "identity": group.label,
                    "trusted_runs": group.trusted,
                    "threshold": group.cutoff,
                    "findings": [
                        {
                            **{key: getattr(d, key) for key in ("metric", "direction", "s")},
                            "means": list(d.means),
                            "run_ids": list(d.run_ids),
                        }
                        for d in group.found
                    ],
                }
                for group in checked
            ],
        },
    }
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def drift_section(found: Sequence[Drift], cutoff: int, trusted: int, run_id: int, path: str) -> str:
    """The markdown the gate adds to report.md after appending the run to the history."""
    lines = [f"- {_md(line)}" for line in drift_lines(found, cutoff, trusted)]
    where = f"Appended as run {run_id} to the history {escape.markdown_code(path)}."
    return "\n".join(["### Drift across runs", "", where, *lines]) + "\n"
