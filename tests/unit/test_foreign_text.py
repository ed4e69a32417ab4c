"""Foreign text is never printed raw (``miles_amd.escape``: no control, format, surrogate or
separator character, no newline), and a secret others echo (a probe's child, a dashboard's job
message, a log line, a URL's credentials) is never printed or stored (``miles_amd.redact``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_amd import escape
from miles_amd.redact import REDACTED, redact
from miles_amd.run.dashboard import jobs_client
from miles_amd.run.driver import Follow, RayJob
from miles_amd.run.probes_miles import parse_with_miles
from miles_amd.run.watcher import FailFastWatcher
from miles_amd.run_dir import RunDir
from tests.cli_runs import run_cli
from tests.constants import EXAMPLE, SHIPPED
from tests.support.fake_dashboard import Reply, fake_dashboard

pytestmark = pytest.mark.unit

UNSAFE = {"Cc", "Cf", "Cs", "Zl", "Zp"}
HOSTILE = ["\n", "\r", "\x1b[31m", "\u202e", "\u2067", "\u200b", "\u200f", "\u2060", "\u061c",
           "\ufeff", "\u2028", "\x85", "\u00ad"]  # fmt: skip


def raw_chars(text: str) -> list[str]:
    """The characters of ``text`` no sink may show raw (a newline is checked per line)."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in UNSAFE]


@given(st.text())
def test_the_escapers_leave_no_control_format_or_separator_character(text: str) -> None:
    for shown in (escape.terminal(text), escape.markdown(text), escape.markdown_code(text)):
        assert "\n" not in shown
        assert raw_chars(shown) == []


@pytest.mark.parametrize(
    ("flag", "bad"),
    [
        ("--model-dir", "a\nb"),
        ("--run-dir", "\x1b[31m"),
        ("--data-dir", "\u202e"),
        ("--miles-dir", "\u200b"),
    ],
)
def test_train_refuses_a_path_with_a_control_or_format_character(flag: str, bad: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        done = run_cli("train", "--dry-run", flag, f"{tmp}/x{bad}")
        assert sorted(os.listdir(tmp)) == []
    assert done.returncode == 2, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"'{flag}'" in lines[0], done.stderr
    assert raw_chars(lines[0]) == [] and done.stdout == ""


def test_the_plan_text_shows_a_newline_in_a_path_escaped() -> None:
    """A plan built with hostile paths (past the CLI's refusal): no forged flag or run dir
    line in the text ``train --dry-run`` prints, every value on its own line."""
    from miles_amd.recipe.plan import build_train_plan, format_plan
    from miles_amd.recipe.settings import Recipe

    recipe = Recipe(model_dir="/m\n  --lr 1e9\u202e")
    plan = build_train_plan(recipe, {"WANDB_API_KEY": ""}, run_dir="/r\nrun dir: /forged")
    lines = format_plan(plan).splitlines()
    assert not any(line.startswith(("  --lr 1e9", "run dir: /forged")) for line in lines)
    assert "run dir: /r\\x0arun dir: /forged" in lines
    assert raw_chars("\n".join(lines)) == []


SECRET = "k3y-0123456789-ABCDEF"
spellings = st.sampled_from(
    [
        "{s}",
        "WANDB_API_KEY={s}",
        '{{"WANDB_API_KEY": "{s}"}}',
        "{{'HF_TOKEN': '{s}'}}",
        "--wandb-key {s}",
        "--wandb-key={s}",
        "--WANDB_KEY={s}",
        "--hf-t {s}",
        "--sglang-api-key\t{s}",
        "Authorization: Bearer {s}",
        "https://ray:{s}@head.example:8265/api/jobs/",
    ]
)


@given(spelling=spellings, before=st.text(max_size=20), after=st.text(max_size=20))
def test_redact_removes_a_secret_in_every_spelling(spelling: str, before: str, after: str) -> None:
    environ = {"WANDB_API_KEY": SECRET}
    text = before + " " + spelling.format(s=SECRET) + " " + after
    shown = redact(text, environ=environ)
    assert SECRET not in shown and REDACTED in shown


def test_redact_keeps_what_is_not_a_secret() -> None:
    text = "--fim-eod-token 5 --lr 1e-5 --api-keys-file x"
    assert redact(text, environ={}) == text


def test_a_parse_error_echoing_the_key_is_redacted(tmp_path: Path) -> None:
    """The node's miles quotes the argv (and the key) in its error: neither the fact's line
    nor the kept stderr carries it (they reach the terminal and env.json)."""
    child = tmp_path / "python"
    child.write_text(
        "#!/bin/sh\n"
        f'echo "env: WANDB_API_KEY={SECRET}" >&2\n'
        f'echo "train.py: error: unrecognized arguments: --wandb-key {SECRET} $WANDB_API_KEY" >&2\n'
        "exit 2\n"
    )
    child.chmod(0o755)
    outcome = parse_with_miles(["--x"], {"WANDB_API_KEY": SECRET, "PATH": "/bin"}, python=child)
    assert not outcome.ok
    assert "unrecognized arguments" in outcome.message
    assert SECRET not in outcome.message + outcome.stderr


def test_a_job_message_echoing_the_key_is_redacted_in_job_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    with fake_dashboard() as fake:
        fake.status = "FAILED"
        echoed = f"runtime_env {{'WANDB_API_KEY': '{SECRET}'}} failed \u202e"
        message = {"type": "SUBMISSION", "status": "FAILED", "entrypoint": "x", "message": echoed}
        fake.replies["status"] = Reply(200, json.dumps(message).encode())
        job = RayJob(jobs_client(fake.address, {}), "job-1", RunDir(tmp_path))
        follow = Follow(timeout_s=5, interval_s=10, echo=lambda _: None)
        record = job.run(FailFastWatcher(tmp_path, lambda _: []), follow, None)
    stored = (tmp_path / "job.json").read_text()
    assert record.status == "FAILED"
    assert SECRET not in stored and REDACTED in stored


def test_a_fatal_log_line_echoing_the_key_is_redacted_in_the_report_and_job_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fatal sentinel's line is quoted in the gate's reports and in the watcher's trip,
    which job.json keeps: neither carries the key the line held."""
    from miles_amd.app.baselines import load, watch_rules
    from miles_amd.evidence.load import load_run
    from miles_amd.judge.gate import judge
    from miles_amd.report.render import render_json, render_markdown, render_text

    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    run = tmp_path / "run"
    shutil.copytree(EXAMPLE, run, ignore=shutil.ignore_patterns("report"))
    with (run / "job.log").open("a", encoding="utf-8") as log:
        log.write(
            "ERROR Current LoRA backend does not support LoRA on MoE layers "
            f"(env WANDB_API_KEY={SECRET}, key {SECRET})\n"
        )
    verdict = judge(load_run(run), load("patched", "--baseline"))
    assert "sentinel.sglang_lora_skips_moe" in {c.name for c in verdict.checks if c.failed}
    reports = render_json(verdict) + render_markdown(verdict) + render_text(verdict)
    assert "does not support LoRA on MoE" in reports and REDACTED in reports
    assert SECRET not in reports
    trip = FailFastWatcher(run, watch_rules(None)).poll()
    assert trip is not None and trip.rule == "sentinel.sglang_lora_skips_moe"
    assert SECRET not in trip.detail and REDACTED in trip.detail


def test_a_submission_to_a_url_with_credentials_prints_none_of_them(tmp_path: Path) -> None:
    """``--ray-address`` may carry credentials (``http://user:password@host``): every line
    the train command prints names the dashboard without them."""
    with fake_dashboard() as fake:
        fake.status = "SUCCEEDED"
        address = fake.address.replace("http://", f"http://ray:{SECRET}@")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        done = run_cli(
            "train", "--ray-address", address, "--run-dir", str(tmp_path / "run"),
            "--timeout", "30", env=env,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr  # submitted; red: the fake job wrote no evidence
    assert fake.count("submit") == 1
    assert "submitted" in done.stdout and REDACTED in done.stdout, done.stdout
    assert SECRET not in done.stdout + done.stderr
    basic = "Basic " + base64.b64encode(f"ray:{SECRET}".encode()).decode()
    assert set(fake.authorizations) == {basic}  # ours and Ray's client's requests alike


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_baseline_diff_shows_a_reviewed_files_text_escaped(fmt: str, tmp_path: Path) -> None:
    """A baseline under review (a pull request's) is foreign: its provenance notes reach the
    terminal and the job summary without a raw control, bidi or zero-width character."""
    doc = json.loads((SHIPPED / "patched.json").read_text())
    doc["provenance"]["notes"] = "".join(HOSTILE) + " <b>| `x`"
    review = tmp_path / "patched.json"
    review.write_text(json.dumps(doc))
    done = run_cli("baseline", "diff", "patched", str(review), "--format", fmt)
    assert done.returncode == 1, done.stderr
    assert raw_chars(done.stdout + done.stderr) == []
    if fmt == "markdown":
        notes_rows = [line for line in done.stdout.splitlines() if "`provenance.notes`" in line]
        assert len(notes_rows) == 1 and "<b>" not in notes_rows[0], done.stdout


def test_a_probes_fact_quoting_the_key_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a probe quotes from its child, the preflight's facts (the table and env.json)
    carry no secret: ``run_preflight`` redacts each fact it collects."""
    from miles_amd.run import preflight
    from miles_amd.run.probes import PreflightConfig

    def probe_echo(_config: PreflightConfig) -> preflight.Fact:
        return preflight.Fact("echo", "wrong", f"HF_TOKEN={SECRET}", f"--hf-token {SECRET}")

    def probe_crash(_config: PreflightConfig) -> preflight.Fact:
        raise RuntimeError(f"child said: --wandb-key={SECRET}")

    monkeypatch.setattr(preflight, "PROBES", (probe_echo, probe_crash))
    config = PreflightConfig(*(Path("/nonexistent"),) * 5)
    facts = preflight.run_preflight(config)
    assert [f.status for f in facts] == ["wrong", "wrong"]
    assert SECRET not in json.dumps([[f.value, f.message] for f in facts])


def test_gate_and_history_show_a_hostile_run_escaped(tmp_path: Path) -> None:
    """A run whose dir name, job id and job message hold every hostile character, gated into
    a history: the gate's stdout, stderr and report.md, and the listing (text and markdown)
    show none of them raw; "report written to" stays one line; nothing is written outside."""
    hostile = "".join(HOSTILE)
    run_dir = tmp_path / "runs" / f"run{hostile}"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report", "README.md"))
    job = json.loads((run_dir / "job.json").read_text())
    job.update(job_id=f"j{hostile}", message=hostile, status="FAILED")
    (run_dir / "job.json").write_text(json.dumps(job))
    history = tmp_path / "h.sqlite"
    args = ("--run-dir", str(run_dir), "--baseline", "patched", "--history", str(history))
    gated = run_cli("gate", *args)
    assert gated.returncode == 1, gated.stderr
    report_md = (run_dir / "report" / "report.md").read_text()
    assert raw_chars(gated.stdout + gated.stderr + report_md) == []
    written = [line for line in gated.stdout.splitlines() if "report written to" in line]
    assert len(written) == 1 and written[0].endswith("metrics.png)"), gated.stdout
    assert os.listdir(tmp_path / "runs") == [run_dir.name]
    for fmt in ("text", "markdown"):
        listed = run_cli("history", "--history", str(history), "--format", fmt)
        assert listed.returncode == 0, listed.stderr
        assert raw_chars(listed.stdout + listed.stderr) == [], fmt
