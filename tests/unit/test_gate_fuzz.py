"""Fuzz the gate and the baseline recorder with hostile run dirs and baselines (corrupt,
duplicate-key, deep or huge-number JSON, NaN and 1e308 values, control characters, markup,
links out), in-process, no figure: a baseline that does not load is a ``BaselineError``, else
the exit code is 0, 1 or 2; nothing else escapes; no escape sequence or markup reaches the
text or markdown; reading changes no file. ``baseline record`` exits 0 with a loadable
baseline or 2 with nothing written. The report's write: ``test_untrusted_input.py``."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from miles_amd.baseline.model import BaselineError, load_baseline
from miles_amd.cli.main import app
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.report.render import render_json, render_markdown, render_text
from tests.constants import EXAMPLE, SHIPPED
from tests.run_dirs import published_values, write_run

pytestmark = pytest.mark.unit

PATCHED = (SHIPPED / "patched.json").read_text()

_PAYLOADS = ["\x1b[31m", "\x1b]0;title\x07", "<img src=x onerror=1>", "[l](http://x)", "\u202e"]
hostile_text = st.tuples(
    st.sampled_from(_PAYLOADS),
    st.lists(st.sampled_from(list("ab<>&|[]()`*#\\\"' \n\r\t{}\x00") + _PAYLOADS), max_size=8),
).map(lambda drawn: drawn[0] + "".join(drawn[1]))  # always one payload, maybe more
hostile_number = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e308", "-1.7e308", "1e999", "9" * 400, "0", "0.5", "-0.0"]
)


@st.composite
def json_texts(draw: st.DrawFn) -> str:
    """A JSON-ish document: valid, duplicate-keyed, deep, cut or with hostile numbers."""
    kind = draw(st.sampled_from(["object"] * 3 + ["duplicate", "deep", "cut", "number", "junk"]))
    value = draw(hostile_text)
    if kind == "object":
        status = draw(st.sampled_from(["FAILED", "SUCCEEDED", "STOPPED"]))
        return json.dumps({"job_id": value or "j", "status": status, "message": value})
    if kind == "duplicate":
        return '{"job_id": "j", "status": "FAILED", "status": "SUCCEEDED"}'
    if kind == "deep":
        depth = draw(st.integers(30, 50_000))
        return "[" * depth + "]" * depth
    if kind == "cut":
        return '{"job_id": "j", "status": "SUCC'
    if kind == "number":
        return '{"job_id": "j", "status": "SUCCEEDED", "end_time": ' + draw(hostile_number) + "}"
    return value


@st.composite
def records(draw: st.DrawFn) -> str:
    """A CI-history line: a metric with hostile values or name, or any JSON-ish text."""
    if draw(st.booleans()):
        return draw(json_texts())
    metric = draw(st.sampled_from(["rollout/raw_reward", "train/pg_clipfrac"]) | hostile_text)
    values = draw(st.lists(hostile_number, min_size=1, max_size=20))
    series = ", ".join(f"[{step}, {value}]" for step, value in enumerate(values))
    return f'{{"metric": {json.dumps(metric)}, "series": [{series}]}}'


@st.composite
def log_lines(draw: st.DrawFn) -> str:
    progress = "x" * 64 + "\r"
    repeat = draw(st.sampled_from([0, 10, 20_000]))
    fatal = draw(st.sampled_from(["", "Fatal Python error: x", "HIP out of memory"]))
    metric = draw(st.sampled_from(["", " log_utils.py:1 - step 1: {'rollout/raw_reward': "]))
    return progress * repeat + fatal + draw(hostile_text) + metric + draw(hostile_number) + "\n"


@st.composite
def baselines(draw: st.DrawFn) -> str | None:
    """None (the shipped ``patched``) or an altered copy of its text."""
    edit = draw(st.sampled_from([None, "duplicate", "nan", "deep", "huge", "junk"]))
    if edit is None:
        return None
    replacement = {
        "duplicate": '"threshold": 99, "threshold": ',
        "nan": '"threshold": NaN, "x": ',
        "deep": '"x": ' + "[" * 40 + "]" * 40 + ', "threshold": ',
        "huge": '"x": ' + "7" * 30 + ', "threshold": ',
        "junk": draw(hostile_text),
    }[edit]
    return PATCHED.replace('"threshold": ', replacement, 1)


ALTERATIONS = ("job_json", "env_json", "record", "log", "link_log", "link_record")


def snapshot(root: Path, skip: Path | None = None) -> dict[str, bytes | str]:
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        key = str(path.relative_to(root))
        if path.is_symlink():
            found[key] = "link -> " + str(path.readlink())
        elif path.is_file():
            found[key] = path.read_bytes()
    return found


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_the_gate_contains_whatever_the_run_dir_and_baseline_hold(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        run_dir, outside = base / "run", base / "outside"
        shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report", "README.md"))
        outside.mkdir()
        (outside / "precious.txt").write_text("untouched")
        for alteration in data.draw(st.lists(st.sampled_from(ALTERATIONS), max_size=4)):
            alter(run_dir, outside, alteration, data)
        baseline_text = data.draw(baselines())
        baseline = "patched"
        if baseline_text is not None:
            baseline = str(outside / "baseline.json")
            Path(baseline).write_text(baseline_text)
        before_outside, before_run = snapshot(outside), snapshot(run_dir)

        try:
            reference = load_baseline(baseline, flag="--baseline")
        except BaselineError:
            assert baseline_text is not None  # the shipped one loads
        else:
            verdict = judge(load_run(run_dir), reference)
            assert verdict.exit_code in (0, 1, 2)
            json.loads(render_json(verdict))
            for text in (render_text(verdict), render_markdown(verdict)):
                assert "\x1b" not in text and "\x07" not in text
            assert "<img" not in render_markdown(verdict)
        assert snapshot(outside) == before_outside
        assert snapshot(run_dir) == before_run


def alter(run_dir: Path, outside: Path, alteration: str, data: st.DataObject) -> None:
    if alteration == "job_json":
        (run_dir / "job.json").write_text(data.draw(json_texts()))
    elif alteration == "env_json":
        facts = data.draw(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "name": st.sampled_from(["gpus", "rocm", "aiter_variant"]) | hostile_text,
                        "status": st.sampled_from(["ok", "wrong", "missing", "maybe"]),
                        "value": st.sampled_from(["8x gfx950 (torch)", "7.2.0"]) | hostile_text,
                    }
                ),
                max_size=4,
            )
        )
        (run_dir / "env.json").write_text(json.dumps({"facts": facts, "ok": True}))
    elif alteration == "record":
        (run_dir / "ci_history" / "9-fuzz.jsonl").write_text(data.draw(records()) + "\n")
    elif alteration == "log":
        with (run_dir / "job.log").open("a", encoding="utf-8", errors="surrogateescape") as log:
            log.write(data.draw(log_lines()))
    elif alteration == "link_log":
        (run_dir / "job.log").unlink(missing_ok=True)
        (run_dir / "job.log").symlink_to(outside / "precious.txt")
    elif alteration == "link_record":
        (run_dir / "ci_history" / "8-link.jsonl").unlink(missing_ok=True)
        (run_dir / "ci_history" / "8-link.jsonl").symlink_to(outside / "precious.txt")


@st.composite
def recorded_values(draw: st.DrawFn) -> dict[str, list[float]]:
    """The published series with one metric's values replaced, scaled or zeroed, as every
    writer writes them (so the sources agree and the recorder reaches its derivations)."""
    values = published_values()
    metric = draw(st.sampled_from(sorted(values)))
    change = draw(st.sampled_from(["one", "scale", "constant"]))
    hostile = st.sampled_from([0.0, -0.0, 5e-324, 1e-300, -1.0, 1.0, 1e30, 3e38, 1e300])
    if change == "one":
        values[metric][draw(st.integers(0, 19))] = draw(hostile)
    elif change == "scale":
        values[metric] = [v * draw(hostile) for v in values[metric]]
    else:
        values[metric] = [draw(hostile)] * len(values[metric])
    return values


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=recorded_values())
def test_baseline_record_contains_whatever_the_run_holds(values: dict[str, list[float]]) -> None:
    """Exit 0 or 2, no traceback, and only ``--out`` written (a loadable baseline if it was)."""
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        run_dir = write_run(base / "run", values)
        out = base / "out" / "recorded.json"
        out.parent.mkdir()
        before_run = snapshot(run_dir)
        args = ["baseline", "record", "--run-dir", str(run_dir), "--variant", "patched"]
        result = CliRunner().invoke(app, [*args, "--out", str(out), "--allow-no-preflight"])

        assert result.exit_code in (0, 2), result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(
            result.exception
        )
        assert "Traceback" not in result.output
        assert snapshot(run_dir) == before_run
        written = sorted(p.name for p in out.parent.iterdir())
        assert written == (["recorded.json"] if result.exit_code == 0 else []), written
        if result.exit_code == 0:
            load_baseline(out)
