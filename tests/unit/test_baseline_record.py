"""`miles-amd baseline record|diff` on real run dirs: what is recorded, what is refused, the diff.

Run dirs are the embedded example (copied) or written in miles' three formats, ``env.json`` by
the real ``preflight.write_env_json``. The expected bands are computed here with
``miles_amd.rules.bands`` directly, not through the recording code.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from miles_amd.baseline.diff import diff_baselines, render_markdown
from miles_amd.baseline.model import load_baseline
from miles_amd.baseline.record import RecordError, record_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.rules import bands
from miles_amd.rules.bands import BandParams
from miles_amd.run.preflight import Fact, write_env_json
from tests.bridge_readings import node_model_facts
from tests.cli_runs import CliRun, flat, run_cli
from tests.constants import (
    CLIPFRAC,
    EXAMPLE,
    FATAL_LINE,
    KL,
    KNOWN_LINE,
    LOGPROB,
    REWARD,
    SHIPPED,
)
from tests.run_dirs import published_values, write_run
from tests.unit.test_gate_canary import canary

RESPONSE_LEN = "rollout/response_len/mean"
TRUNCATED = "rollout/truncated_ratio"
GRAD_NORM = "train/grad_norm"
JOB_ID = "raysubmit_rec0001"
write_run = partial(write_run, job_id=JOB_ID)


def shifted_values(rollouts: int = 20) -> dict[str, list[float]]:
    """A healthy run unlike jvvnhop9: every ruled metric logged, each shifted a little."""
    values = published_values(rollouts)
    values[LOGPROB] = [v * 1.04 for v in values[LOGPROB]]
    values[REWARD] = [v + (1 / 64 if i % 2 == 0 else 0.0) for i, v in enumerate(values[REWARD])]
    values[KL] = [0.0007 + 0.00002 * i for i in range(rollouts)]
    values[RESPONSE_LEN] = [2800.0 + 10 * i for i in range(rollouts)]
    values[TRUNCATED] = [(24 + i % 5) / 64 for i in range(rollouts)]
    values[GRAD_NORM] = [0.1 + 0.01 * i for i in range(rollouts)]
    return values


# The patched aiter's fingerprint on a node (miles_amd.aiter_fix), and the image's stock one
NODE_FIX = "fixed: /opt/aiter/csrc/include/custom_all_reduce.cuh sha256:0123456789ab (tiles)"
STOCK_FIX = "not fixed: /usr/aiter_meta/csrc/include/custom_all_reduce.cuh sha256:aaaaaaaaaaaa (x)"


def write_env(run_dir: Path, *, ok: bool = True, variant: str | None = "patched") -> None:
    """env.json as `miles-amd preflight` writes it (the real writer), passing or not."""
    facts = [
        Fact("gpus", "ok", "8x gfx950 (torch)")
        if ok
        else Fact("gpus", "missing", "", "no AMD GPU visible"),
        Fact("rocm", "ok", "7.2.0-43 (/opt/rocm/.info/version)"),
        Fact("aiter", "ok", "amd-aiter 0.1.5 (commit 1a2b3c4)"),
        Fact("aiter_variant", "ok", variant or "unrecorded"),
        *node_model_facts(),  # the deep probe's, as a node records them
        Fact("aiter_fix", "ok", NODE_FIX if variant != "stock" else STOCK_FIX),
    ]
    write_env_json(facts, run_dir, {"host": "node-1"})


# SGLang's INFO line when its rollout all-reduce is aiter's (sglang 0.5.16
# custom_all_reduce.py), as Ray prefixes an engine's output in the job log.
AR_LINE = (
    "\x1b[36m(SGLangEngine pid=5151)\x1b[0m [2026-11-20 10:01:02 TP0] "
    "[AR] Using AiterCustomAllreduce (AMD default)\n"
)


def write_ar_line(run_dir: Path) -> None:
    """The job log says which all-reduce ran (allreduce.path) and, first, which aiter the job
    imports (allreduce.fix), as a node's log does."""
    with open(run_dir / "job.log", "a", encoding="utf-8") as log:
        log.write(f'MILES_AMD_AITER_FIX {{"value": "{NODE_FIX}"}}\n' + AR_LINE)


def copy_example(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report"))
    return run_dir


def record_main(*args: str) -> CliRun:
    return run_cli("baseline", "record", *args)


def record_cli(run_dir: Path, out: Path, *extra: str, variant: str = "patched") -> CliRun:
    return record_main("--run-dir", str(run_dir), "--variant", variant, "--out", str(out), *extra)


def assert_refused(result, out: Path, *phrases: str) -> None:
    """Exit 2, one line on stderr with every phrase and a fix, nothing written next to out."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("miles-amd: error: ") and "fix:" in lines[0], lines[0]
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    assert not out.exists()
    if out.parent.exists():
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


def band_of(raw: dict, rule_id: str) -> tuple[float | None, float | None]:
    (rule,) = [r for r in raw["rules"] if r["id"] == rule_id]
    return rule["band"]["low"], rule["band"]["high"]


def test_a_complete_run_with_passing_preflight_records_and_round_trips(tmp_path: Path) -> None:
    values = shifted_values()
    run_dir = write_run(tmp_path / "run", values)
    write_env(run_dir)
    write_ar_line(run_dir)
    canary(run_dir, "aiter", bad=False, variant="patched", aiter_fix=NODE_FIX)  # clean
    out = tmp_path / "baselines" / "patched.json"
    result = record_main("--run-dir", str(run_dir), "--variant", "patched", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert f"wrote {out}" in result.stdout and f"baseline diff patched {out}" in result.stdout

    recorded = load_baseline(out)  # the very loader the gate uses
    raw = json.loads(out.read_text())
    assert recorded.name == "patched" and recorded.run_id == JOB_ID
    provenance = recorded.provenance
    assert provenance["hardware"] == "8x gfx950 (torch)"
    assert provenance["rocm"] == "7.2.0-43 (/opt/rocm/.info/version)"
    assert provenance["aiter"].startswith("patched") and "amd-aiter 0.1.5" in provenance["aiter"]
    assert provenance["image"] == "unrecorded (env.json has no image fact)"
    assert provenance["job_status"] == "SUCCEEDED" and provenance["duration"] == "1h02m05s"
    assert (provenance["rollouts"], provenance["optimizer_steps"]) == (20, 20)
    assert provenance["source"].startswith(f"miles-amd baseline record --run-dir {run_dir}")
    assert "recorded_at 20" in provenance["notes"] and "preflight: passed" in provenance["notes"]

    # the series are the run's, exactly as the readers return them
    evidence = load_run(run_dir)
    for metric in (LOGPROB, REWARD, CLIPFRAC, KL, RESPONSE_LEN, TRUNCATED, GRAD_NORM):
        assert list(recorded.series[metric]) == [v for _, v in evidence.series[metric]]
        pairs = zip(recorded.series[metric], values[metric], strict=True)
        assert all(math.isclose(read, written, rel_tol=1e-6) for read, written in pairs)

    # every band is the one bands.py gives for the run's series, with the template's k/cover
    template = json.loads((SHIPPED / "patched.json").read_text())
    for rule in template["rules"]:
        if "band" not in rule:
            continue
        series = [v for _, v in evidence.series[rule["metric"]]]
        spread = bands.series_spread(series)
        derive = rule["derive"]
        run_sd, rho = derive.get("run_sd", 0.0), derive.get("rho", 0.0)
        if rule["kind"] == "mean_within":
            expected = bands.mean_band(spread, 20, derive["k"], derive["cover"], run_sd, rho)
        else:
            expected = bands.max_band(spread, 20, derive["k"], derive["cover"], run_sd)
        assert band_of(raw, rule["id"]) == (expected.low, expected.high), rule["id"]
        assert band_of(raw, rule["id"]) != band_of(template, rule["id"]), rule["id"]

    # round trip: the gate passes the run against the recorded baseline
    verdict = judge(evidence, recorded, require_env=True)
    assert verdict.verdict == "pass", verdict.reason
    assert {c.name for c in verdict.checks if c.status == "not_measured"} == set()
    # the identity the gate compares later runs with is env.json's, read as the gate reads it
    assert recorded.provenance["environment"] == {
        "gpu_arch": "gfx950", "gpu_count": 8, "rocm": "7.2", "aiter_variant": "patched",
        "aiter_version": "amd-aiter 0.1.5 (commit 1a2b3c4)",
        "aiter_commit": None,  # this env.json has no aiter_commit fact
    }  # fmt: skip
    # a run with another aiter build is not judged by this reference
    other = copy_example(tmp_path / "other")
    facts = [Fact("gpus", "ok", "8x gfx950 (torch)"), Fact("aiter_variant", "ok", "patched"),
             Fact("rocm", "ok", "7.2.0-43 (/opt/rocm/.info/version)"),
             Fact("aiter", "ok", "amd-aiter 0.1.6 (commit 9f8e7d6)")]  # fmt: skip
    write_env_json(facts, other, {})
    verdict = judge(load_run(other), recorded)
    assert verdict.verdict == "fail"
    assert "environment.identity" in verdict.reason


def test_the_rules_are_the_shipped_ones(tmp_path: Path) -> None:
    for variant in ("patched", "stock"):
        run_dir = write_run(tmp_path / variant, shifted_values())
        write_env(run_dir, variant=variant)
        out = tmp_path / f"{variant}.json"
        result = record_cli(run_dir, out, variant=variant)
        assert result.returncode == 0, result.stderr
        template = json.loads((SHIPPED / f"{variant}.json").read_text())
        recorded = json.loads(out.read_text())
        assert recorded["run_shape"] == template["run_shape"]
        fixed = (
            *("id", "kind", "metric", "required", "rationale", "threshold", "quantum", "atol"),
            *("z", "expected_status", "derive"),
        )
        assert [{k: r.get(k) for k in fixed} for r in recorded["rules"]] == [
            {k: r.get(k) for k in fixed} for r in template["rules"]
        ]
        for before, after in zip(template["rules"], recorded["rules"], strict=True):
            if "band" in after:  # a band's derivation now names the recorded run's figures
                assert f"run {JOB_ID}" in after["derivation"]
            else:
                assert after["derivation"] == before["derivation"]
        judged = judge(load_run(run_dir), load_baseline(out))
        assert judged.verdict == "pass", judged.reason


def test_the_example_records_with_allow_no_preflight_and_round_trips(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    out = tmp_path / "patched.json"
    args = ("--run-dir", str(run_dir), "--variant", "patched", "--out", str(out))
    result = record_main(*args, "--allow-no-preflight")
    assert result.returncode == 0, result.stderr
    recorded = load_baseline(out)
    assert recorded.run_id == "jvvnhop9"
    assert (
        "preflight: not run (no env.json; recorded with --allow-no" in recorded.provenance["notes"]
    )
    assert recorded.provenance["hardware"] == "unrecorded (no env.json)"
    # no env.json: nothing the gate could compare later runs with; the variant is --variant's
    assert recorded.provenance["environment"] == {
        "gpu_arch": None, "gpu_count": None, "rocm": None, "aiter_variant": "patched",
        "aiter_version": None, "aiter_commit": None,
    }  # fmt: skip
    assert recorded.provenance["source"].endswith("--allow-no-preflight")
    # the example lacks KL, response length and truncation: their summaries are carried over
    patched = load_baseline("patched")
    for metric in (KL, RESPONSE_LEN, TRUNCATED):
        assert metric not in recorded.series
        assert recorded.summaries[metric]["mean"] == patched.summaries[metric]["mean"]
        assert "carried over from the shipped patched" in recorded.summaries[metric]["note"]
    verdict = judge(load_run(run_dir), recorded)
    assert verdict.verdict == "pass", verdict.reason
    # the example holds the published series: its bands are the shipped ones
    diff = diff_baselines(patched, recorded)
    assert [r.rule_id for r in diff.rules if "tolerance" in r.aspects] == []


def corrupt_event_file(run_dir: Path) -> str:
    event_file = max((run_dir / "tensorboard").iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(event_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside a record: a CRC mismatch
    event_file.write_bytes(bytes(data))
    return str(event_file)


def append_log(line: str) -> Callable[[Path], str]:
    def apply(run_dir: Path) -> str:
        with open(run_dir / "job.log", "a", encoding="utf-8") as log:
            log.write(line)
        return f"{run_dir}/job.log"

    return apply


def with_value(metric: str, step: int, value: float) -> dict[str, list[float]]:
    values = published_values()
    values[metric][step] = value
    return values


def without_metric(metric: str) -> dict[str, list[float]]:
    return {m: vs for m, vs in published_values().items() if m != metric}


# write_run's keywords, env.json's (None: none), an edit returning a phrase, the extra flags,
# the phrases of the one-line refusal ("{run}" the run dir)
REFUSALS: dict[str, tuple[dict, dict | None, Callable[[Path], object] | None, tuple, list]] = {
    "failed job": ({"status": "FAILED"}, {}, None, (),
        ["{run}/job.json", "ended FAILED", "not SUCCEEDED"]),
    "stopped job": ({"status": "STOPPED"}, {}, None, (), ["ended STOPPED"]),
    "no job.json": ({}, {}, lambda d: (d / "job.json").unlink(), (), ["{run}/job.json: missing"]),
    "short run": ({"values": published_values(15)}, {}, None, (),
        ["missing steps 15..19", "--num-rollouts"]),
    "lost rollout": ({"rollouts": [s for s in range(20) if s != 7]}, {}, None, (),
        ["missing steps 7"]),
    "duplicated rollout": ({"rollouts": [*range(6), 5, *range(6, 20)]}, {}, None, (),
        ["duplicated steps 5"]),
    "nan": ({"values": with_value(LOGPROB, 7, math.nan)}, {}, None, (),
        [f"{LOGPROB} is nan at step 7", "diverged"]),
    "corrupt event file": ({}, {}, corrupt_event_file, (), ["unreadable evidence", "tensorboard"]),
    "no env.json": ({}, None, None, (),
        ["{run}/env.json", "preflight did not run", "--allow-no-preflight"]),
    "failed preflight": ({}, {"ok": False}, None, (),
        ["{run}/env.json", "preflight did not pass (gpus missing)"]),
    "other variant": ({}, {"variant": "stock"}, None, (),
        ["--variant patched", "aiter_variant 'stock'", "--variant stock"]),
    "fatal log line": ({}, {}, append_log(FATAL_LINE), (), ["fatal log signature"]),
    "spike": ({"values": with_value(LOGPROB, 4, 0.31)}, {}, None, (),
        ["fails the rules of its own recorded baseline",
         "logprob_abs_diff.spikes", "rollout 4 (0.31)"]),
    # step_rise works on logarithms: a zero gap cannot derive it (the rule is named)
    "zero logprob gap": ({"values": with_value(LOGPROB, 0, 0.0)}, {}, None, (),
        ["rule logprob_abs_diff.step cannot be derived", "non-positive reference value", LOGPROB]),
    "missing required metric": ({"values": without_metric(CLIPFRAC)}, {}, None, (),
        [f"no {CLIPFRAC}", "pg_clipfrac.steps"]),
    "bad name": ({}, {}, None, ("--name", "Mixed Case"), ["--name 'Mixed Case'"]),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS)
def test_a_run_that_cannot_be_a_reference_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    run_kw, env_kw, edit, flags, phrases = REFUSALS[case]
    values: dict[str, Any] = {"values": published_values(), **run_kw}
    run_dir = write_run(tmp_path / "run", **values)
    if env_kw is not None:
        write_env(run_dir, **env_kw)
    named = edit(run_dir) if edit is not None else None
    out = tmp_path / "patched.json"
    result = record_cli(run_dir, out, *flags)
    assert_refused(result, out, *(p.format(run=run_dir) for p in phrases))
    if isinstance(named, str):
        assert named in result.stderr


def record_direct(run_dir: Path, template, name: str = "x") -> dict:
    evidence = load_run(run_dir)
    return record_baseline(evidence, template, variant="patched", name=name, recorded_at="t",
                           allow_no_preflight=True)  # fmt: skip


def test_a_missing_run_dir_or_name_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "patched.json"
    nope = tmp_path / "nope"
    result = record_main("--run-dir", str(nope), "--variant", "patched", "--out", str(out))
    assert_refused(result, out, f"--run-dir {nope}")
    run_dir = write_run(tmp_path / "run", published_values())
    with pytest.raises(RecordError, match="--name 'X'"):
        record_direct(run_dir, load_baseline("patched"), name="X")


def test_a_short_run_records_with_its_count_and_a_failed_preflight_when_allowed(
    tmp_path: Path,
) -> None:
    run_dir = write_run(tmp_path / "run", published_values(15))
    write_env(run_dir, ok=False)
    out = tmp_path / "patched.json"
    result = record_cli(run_dir, out, "--num-rollouts", "15", "--allow-no-preflight")
    assert result.returncode == 0, result.stderr
    recorded = load_baseline(out)
    assert recorded.run_shape.rollouts == 15 and len(recorded.series[LOGPROB]) == 15
    spread = bands.series_spread([v for _, v in load_run(run_dir).series[LOGPROB]])
    expected = bands.mean_band(spread, 15, 4.0, [0.0171], 0.03, 0.3)
    (rule,) = [r for r in recorded.rules if r.id == "logprob_abs_diff.mean"]
    assert BandParams.of(rule).band == expected
    assert judge(load_run(run_dir), recorded, expected_rollouts=15).verdict == "pass"
    provenance = recorded.provenance
    assert "preflight: failed: gpus missing (recorded with --allow-no" in provenance["notes"]
    assert provenance["hardware"] == "unrecorded (preflight gpus: missing)"
    assert "no passing preflight" in provenance["aiter"]


def test_a_known_log_signature_is_noted_and_an_existing_out_kept_unless_forced(
    tmp_path: Path,
) -> None:
    run_dir = write_run(tmp_path / "run", published_values())
    write_env(run_dir)
    append_log(KNOWN_LINE * 8)(run_dir)
    out = tmp_path / "patched.json"
    out.write_text("keep me")
    result = record_cli(run_dir, out)
    assert result.returncode == 2 and "--out" in result.stderr and "--force" in result.stderr
    assert out.read_text() == "keep me"
    assert record_cli(run_dir, out, "--force").returncode == 0
    recorded = load_baseline(out)
    assert recorded.run_id == JOB_ID
    assert "known log signatures: megatron_moe_router_not_fp32 x8" in recorded.provenance["notes"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".patched.json")] == []


def diff_main(*args: str) -> CliRun:
    return run_cli("baseline", "diff", *args)


def rule_blocks(text: str) -> dict[str, str]:
    """Rule id -> its lines in the text diff (head line and indented detail lines)."""
    blocks: dict[str, str] = {}
    current = None
    for line in text.split("\n\nprovenance")[0].splitlines():
        if line[:2] in ("* ", "  ") and not line.startswith("    "):
            current = line[2:].split(" ", 1)[0]
            blocks[current] = line
        elif current is not None and line.startswith("    "):
            blocks[current] += "\n" + line
    return blocks


def test_diff_marks_every_changed_band(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", shifted_values())
    write_env(run_dir)
    out = tmp_path / "patched.json"
    assert record_cli(run_dir, out).returncode == 0
    result = diff_main("patched", str(out))
    assert result.returncode == 1, result.stderr  # they differ (as diff(1))
    old, new = json.loads((SHIPPED / "patched.json").read_text()), json.loads(out.read_text())
    band_ids = [r["id"] for r in old["rules"] if "band" in r]
    changed = {i for i in band_ids if band_of(old, i) != band_of(new, i)}
    assert len(changed) == 5  # every mean/max band moved with the shifted run
    blocks = rule_blocks(result.stdout)
    assert set(blocks) == {r["id"] for r in old["rules"]}
    for rule_id, block in blocks.items():
        if rule_id in changed:
            low, high = band_of(new, rule_id)
            assert block.startswith(f"* {rule_id} ") and "CHANGED: tolerance" in flat(block), block
            # the tolerance is the sentence the gate shows as the check's expected value
            assert f"-> {bands.Band(low, high).describe()}" in block, block
            assert "reference: mean" in block and " -> mean" in block
        elif rule_id == "raw_reward.spread":  # its floor is derived from the reference mean
            assert "CHANGED: tolerance" in block, block
        else:
            assert "tolerance" not in block.splitlines()[0], block
    assert f"* provenance.run_id: jvvnhop9 -> {JOB_ID}" in result.stdout
    assert "  run_shape.rollouts: 20 (unchanged)" in result.stdout
    assert "0 added, 0 removed" in result.stdout

    markdown = diff_main("patched", str(out), "--format", "markdown")
    assert markdown.returncode == 1
    rows = {line.split("`")[1]: line for line in markdown.stdout.splitlines() if "`" in line}
    for rule_id in changed:
        assert "**changed**: tolerance, reference" in rows[rule_id]
    expected = render_markdown(diff_baselines(load_baseline("patched"), load_baseline(out)))
    assert markdown.stdout == expected


def test_diff_of_the_shipped_baselines_lists_added_removed_and_same() -> None:
    stock = {r.id for r in load_baseline("stock").rules}
    patched = {r.id for r in load_baseline("patched").rules}
    result = diff_main("patched", "stock")
    assert result.returncode == 1, result.stderr
    blocks = rule_blocks(result.stdout)
    removed = {rule_id for rule_id, block in blocks.items() if "RULE REMOVED" in block}
    assert removed == patched - stock and removed
    assert f"0 added, {len(removed)} removed" in result.stdout
    assert "required: required -> optional" in blocks["pg_clipfrac.near_zero"]

    found = json.loads(diff_main("stock", "patched", "--format", "json").stdout)
    assert found["differs"] is True
    by_id = {r["id"]: r for r in found["rules"]}
    assert {i for i, r in by_id.items() if r["change"] == "added"} == patched - stock
    assert by_id["pg_clipfrac.near_zero"]["aspects"] == ["required"]
    assert [f for f in found["fields"] if f["field"] == "provenance.run_id"] == [
        {"field": "provenance.run_id", "before": "4it2x89i", "after": "jvvnhop9", "changed": True}
    ]

    same = diff_main("patched", str(SHIPPED / "patched.json"))
    assert same.returncode == 0  # the same: exit 0, as diff(1)
    assert "0 tolerance(s) changed, 0 row(s) changed, 0 added, 0 removed" in same.stdout
    assert not [line for line in same.stdout.splitlines() if line.startswith("*")]
    as_json = json.loads(diff_main("patched", "patched", "--format", "json").stdout)
    assert as_json["differs"] is False and {r["change"] for r in as_json["rules"]} == {"same"}


def test_diff_refuses_a_baseline_that_does_not_load(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    raw = json.loads((SHIPPED / "patched.json").read_text())
    raw["rules"][4]["band"]["high"] = 0.5  # not the derived band
    broken.write_text(json.dumps(raw))
    result = diff_main("patched", str(broken))
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"miles-amd: error: NEW {broken}: ") and "fix:" in line
    missing = diff_main(str(tmp_path / "absent.json"), "patched")
    assert missing.returncode == 2 and "OLD " in missing.stderr


def test_an_unlogged_metric_whose_band_only_a_series_can_give_is_refused(tmp_path: Path) -> None:
    # a valid template whose optional KL rule's spread comes from a series only (no summary)
    run_dir = write_run(tmp_path / "shifted", shifted_values())
    write_env(run_dir)
    template_path = tmp_path / "patched.json"
    assert record_cli(run_dir, template_path).returncode == 0
    raw = json.loads(template_path.read_text())
    del raw["evidence"]["summaries"][KL]
    template_path.write_text(json.dumps(raw))
    template = load_baseline(template_path)
    with pytest.raises(RecordError, match=r"rule train_rollout_kl\.mean needs the run's own"):
        record_direct(copy_example(tmp_path), template)


def documented_update_flow() -> list[str]:
    """The command lines of docs/cli.md's "Update a baseline" block, comments dropped."""
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    block = text.split("## Update a baseline", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_documented_update_flow_ends_with_the_gate_naming_the_baseline(
    tmp_path: Path,
) -> None:
    # docs/cli.md's four lines in a scratch checkout: the example as the node's run, a copy of
    # the shipped baselines as the repo's (the example has no preflight: --allow-no-preflight)
    run = tmp_path / "runs/mi355x/patched"
    shutil.copytree(EXAMPLE, run, ignore=shutil.ignore_patterns("report"))
    # a new reference run: jvvnhop9's evidence is pinned (miles_amd.baseline.shipped), so a
    # re-recording of the example under its id is refused as the shipped patched
    job = json.loads((run / "job.json").read_text())
    (run / "job.json").write_text(json.dumps({**job, "job_id": "n3wref01"}))
    shutil.copytree(SHIPPED, tmp_path / "baselines/gpt_oss_20b_lora/8gpu/mi355x")
    env = {**os.environ, "MILES_AMD_BASELINES_DIR": str(tmp_path / "baselines")}
    lines = documented_update_flow()
    assert [line.split()[1] for line in lines] == [
        "baseline", "baseline", "baselines/review/8gpu/mi355x/patched.json", "gate"
    ]  # fmt: skip
    outputs = []
    for line in lines:
        words = line.split()
        if words[0] == "mv":
            os.replace(tmp_path / words[1], tmp_path / words[2])
            continue
        extra = ["--allow-no-preflight"] if words[1:3] == ["baseline", "record"] else []
        result = run_cli(*words[1:], *extra, env=env, cwd=tmp_path)
        differs = words[1:3] == ["baseline", "diff"]  # exit 1: they differ, as diff(1)
        assert result.returncode == (1 if differs else 0), (line, result.stderr)
        outputs.append(result.stdout)
    assert "(baseline patched, run n3wref01" in outputs[0]
    assert "against baseline patched (n3wref01)" in flat(outputs[-1]), outputs[-1]
    assert "matches the shipped patched" in outputs[-1], outputs[-1]
