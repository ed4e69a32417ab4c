"""Issue 26 item 1: a pull request cannot loosen its own gate through baselines/.

The attacks are made on a copy of the shipped baselines/ tree that ``$MILES_AMD_BASELINES_DIR``
names (as CI names the base branch's): a shipped baseline without the recipe's required rules,
or whose reference evidence is not the published one, is refused (through the real CLI: exit
2, one line naming the file, the JSON path and the fix); the gate's baseline identity says
whether it is the shipped one. The review step is amd-pr.yml's own script, run by bash.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from miles_amd.app import AppError
from miles_amd.app.baselines import identity, load
from miles_amd.baseline.model import BASELINES_DIR_ENV, BaselineError, parse_baseline
from miles_amd.baseline.shipped import (
    PUBLISHED_EVIDENCE,
    REQUIRED_RULES,
    baseline_digest,
    evidence_digest,
)
from miles_amd.cli.main import app
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.report.render import render_text
from miles_amd.rules.model import Baseline
from tests.constants import (
    BASELINES,
    EXAMPLE,
    PUBLISHED_LOGPROB,
    PUBLISHED_REWARD,
    REPO,
    REWARD,
    SHIPPED,
    SHIPPED_UNDER,
)

pytestmark = pytest.mark.unit

REWARD_RULES = ("raw_reward.mean", "raw_reward.paired", "raw_reward.spread")


def shipped_doc(name: str) -> dict[str, Any]:
    return json.loads((SHIPPED / f"{name}.json").read_text())


@contextmanager
def baselines_tree(**docs: dict[str, Any]) -> Iterator[Path]:
    """A copy of baselines/ with ``docs`` written over the shipped files (name -> JSON)."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "baselines"
        shutil.copytree(BASELINES, root)
        for name, doc in docs.items():
            (root / SHIPPED_UNDER / f"{name}.json").write_text(json.dumps(doc, indent=2))
        yield root


def gate(baselines: Path | None, report_dir: Path, *spec: str):
    env = {BASELINES_DIR_ENV: str(baselines)} if baselines is not None else {}
    args = ["gate", "--run-dir", str(EXAMPLE), "--report-dir", str(report_dir), "--no-history"]
    return CliRunner().invoke(app, [*args, "--baseline", *(spec or ("patched",))], env=env)


def one_line(result) -> str:
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def without_rules(doc: dict[str, Any], ids: tuple[str, ...]) -> dict[str, Any]:
    return {**doc, "rules": [r for r in doc["rules"] if r["id"] not in ids]}


@pytest.mark.parametrize(("name", "run_id"), [("patched", "jvvnhop9"), ("stock", "4it2x89i")])
def test_each_shipped_baseline_has_the_required_rules_and_published_evidence_digest(
    name: str, run_id: str
) -> None:
    """The recipe's list is derived from the reviewed files: each required (kind, metric)."""
    doc = shipped_doc(name)
    required = {(r["kind"], r.get("metric")) for r in doc["rules"] if r["required"]}
    assert required == REQUIRED_RULES[name]
    baseline = parse_baseline(json.dumps(doc), path=name)
    assert baseline.run_id == run_id
    assert baseline.provenance["evidence_sha256"] == evidence_digest(baseline)
    assert PUBLISHED_EVIDENCE[run_id] == evidence_digest(baseline)


def test_the_pinned_digest_is_the_digest_of_the_published_series() -> None:
    """jvvnhop9's pinned digest covers the series the seed pull request published (typed in
    independently in tests/constants.py) and the example run dir reconstructs."""
    from miles_amd.evidence.load import load_run

    doc = shipped_doc("patched")
    assert doc["evidence"]["series"][REWARD] == PUBLISHED_REWARD
    assert doc["evidence"]["series"]["train/train_rollout_logprob_abs_diff"] == PUBLISHED_LOGPROB
    example = load_run(EXAMPLE).series[REWARD]
    assert [round(v, 4) for _, v in example] == PUBLISHED_REWARD
    changed = json.loads(json.dumps(doc))
    changed["evidence"]["series"][REWARD][0] += 1 / 64
    assert evidence_digest(Baseline.from_json(changed, "x")) != PUBLISHED_EVIDENCE["jvvnhop9"]


@pytest.mark.parametrize(
    ("name", "doc", "phrase"),
    [
        # issue 26: deleting raw_reward.mean/.paired/.spread let a halved reward pass
        ("patched", without_rules(shipped_doc("patched"), REWARD_RULES),
         "$.rules: the recipe requires a mean_within rule on rollout/raw_reward"),
        ("stock", {**shipped_doc("stock"), "rules": [
            {**r, "required": r["required"] and r["id"] != "raw_reward.spread"}
            for r in shipped_doc("stock")["rules"]]},
         "the recipe requires the sd_at_least rule on rollout/raw_reward and it is optional"),
    ],
)  # fmt: skip
def test_a_shipped_baseline_without_a_required_rule_is_refused(
    tmp_path: Path, name: str, doc: dict[str, Any], phrase: str
) -> None:
    with baselines_tree(**{name: doc}) as root:
        result = gate(root, tmp_path / "report", name)
        assert result.exit_code == 2, result.output
        line = one_line(result)
        assert f"--baseline {name}: {root / SHIPPED_UNDER / f'{name}.json'}: " in line
        assert phrase in line and "fix: " in line
        assert not (tmp_path / "report").exists()


def _hint_value(text: str) -> Any:
    """The value of a loader hint: JSON, or a band spelled ``{low: x, high: y}``."""
    quoted = re.sub(r"([{,]\s*)([a-z_]+):", r'\1"\2":', text).replace("None", "null")
    return json.JSONDecoder().raw_decode(quoted)[0]


def rederive(doc: dict[str, Any]) -> dict[str, Any]:
    """Follow the loader's own "fix:" hints until the document loads: what an attacker who
    rewrote the reference series does to make the bands consistent with it."""
    doc = json.loads(json.dumps(doc))
    for _ in range(100):
        try:
            parse_baseline(json.dumps(doc), path="x")
            return doc
        except BaselineError as exc:
            error = str(exc)
        cover = re.match(r"x: \$\.rules\[(\d+)\]\.derive\.cover: ", error)
        hint = re.match(r"x: \$\.rules\[(\d+)\]((?:\.[a-z_]+)+): .*fix: set it to (.+)$", error)
        drop = re.match(r"x: \$\.rules\[(\d+)\]\.([a-z_]+): .*fix: .*or drop \2$", error)
        if cover:
            doc["rules"][int(cover[1])]["derive"]["cover"] = []
        elif drop:
            del doc["rules"][int(drop[1])][drop[2]]
        elif hint:
            target = doc["rules"][int(hint[1])]
            *path, last = hint[2].split(".")[1:]
            for key in path:
                target = target[key]
            target[last] = _hint_value(hint[3])
        else:
            raise AssertionError(f"no hint to follow: {error}")
    raise AssertionError("the hints did not converge")


def halved_reward(doc: dict[str, Any]) -> dict[str, Any]:
    forged = json.loads(json.dumps(doc))
    series = forged["evidence"]["series"][REWARD]
    forged["evidence"]["series"][REWARD] = [round(v * 32) / 64 for v in series]
    return forged


@pytest.mark.parametrize("recompute_digest", [False, True])
def test_rewritten_series_with_rederived_bands_is_refused(
    tmp_path: Path, recompute_digest: bool
) -> None:
    """Issue 26: the reference series rewritten (reward halved), the bands re-derived with the
    loader's hints; provenance still names jvvnhop9. It loads as a file (self-consistent), and
    is refused as the shipped patched whether or not its digest field was rewritten too."""
    forged = rederive(halved_reward(shipped_doc("patched")))
    forged_baseline = parse_baseline(json.dumps(forged), path="forged")
    assert forged_baseline.run_id == "jvvnhop9"
    if recompute_digest:
        forged["provenance"]["evidence_sha256"] = evidence_digest(forged_baseline)
    with baselines_tree(patched=forged) as root, pytest.raises(AppError) as error:
        refused(root, "patched")
    line = str(error.value)
    assert f"--baseline patched: {root / SHIPPED_UNDER / 'patched.json'}: " in line
    if recompute_digest:
        published = PUBLISHED_EVIDENCE["jvvnhop9"]
        assert "$.evidence: digest " in line
        assert f"is not the published evidence of run jvvnhop9 ({published})" in line
    else:
        assert "$.provenance.evidence_sha256: " in line
        assert "its reference series or summaries were changed" in line


def refused(root: Path, spec: str = "patched"):
    """What the gate loads for ``--baseline spec`` with ``root`` as the shipped baselines/."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BASELINES_DIR_ENV, str(root))
        return load(spec, "--baseline")


def test_the_gate_says_whether_its_baseline_is_the_shipped_one(tmp_path: Path) -> None:
    shipped = baseline_digest(parse_baseline((SHIPPED / "patched.json").read_text(), path="p"))
    assert identity(load("patched", "--baseline")) == (shipped, shipped)
    said = f"baseline sha256 {shipped[:16]}: matches the shipped patched"
    verdict = judge(load_run(EXAMPLE), load("patched", "--baseline"))
    assert said in render_text(replace(verdict, baseline_sha256=shipped, shipped_sha256=shipped))
    # passed by path, a changed copy is the user's own: judged, and said to differ
    doc = shipped_doc("patched")
    doc["description"] += " (edited)"
    path = tmp_path / "review" / "patched.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    digest, found = identity(load(str(path), "--baseline"))
    assert found == shipped != digest
    text = render_text(replace(verdict, baseline_sha256=digest, shipped_sha256=found))
    assert "DIFFERS from the shipped patched" in text


def mutate(doc: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    kind = data.draw(st.sampled_from(["drop_rule", "optional", "series", "summary", "digest"]))
    if kind in ("drop_rule", "optional"):
        index = data.draw(st.integers(0, len(doc["rules"]) - 1))
        if kind == "drop_rule":
            del doc["rules"][index]
        else:
            doc["rules"][index]["required"] = False
    elif kind == "series":
        values = doc["evidence"]["series"][REWARD]
        index = data.draw(st.integers(0, len(values) - 1))
        values[index] = data.draw(st.sampled_from([0.0, 1.0, 0.25, values[index] + 1 / 64]))
    elif kind == "summary":
        doc["evidence"]["summaries"][REWARD]["mean"] = data.draw(st.sampled_from([0.3, 0.9]))
    else:
        doc["provenance"]["evidence_sha256"] = data.draw(
            st.sampled_from(["0" * 64, PUBLISHED_EVIDENCE["4it2x89i"]])
        )
    return doc


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_changed_shipped_baseline_never_judges(data: st.DataObject) -> None:
    """Any one change to a shipped file (a rule dropped or made optional, a reference value,
    a summary, the digest): refused in one line unless the change left a loadable shipped file
    whose required rules and evidence are the recipe's (an optional rule dropped or relaxed)."""
    original = shipped_doc("patched")
    doc = mutate(original, data)
    with baselines_tree(patched=doc) as root:
        try:
            refused(root)
            loaded = True
        except AppError as exc:
            assert "\n" not in str(exc) and "fix:" in str(exc), exc
            loaded = False
    required = {(r["kind"], r.get("metric")) for r in doc["rules"] if r["required"]}
    intact = (
        doc["evidence"] == original["evidence"]
        and doc["provenance"] == original["provenance"]
        and REQUIRED_RULES["patched"] <= required
    )
    assert intact or not loaded


def run_review_step(tmp_path: Path, pr_patched: dict[Path, dict[str, Any]]):
    """amd-pr.yml's "Diff the baselines against the base branch" script, run by bash in a
    scratch checkout: the base's baselines/ in .reviewed/, the pull request's beside it, its
    patched files under their keys' dirs (another key: a new file)."""
    import yaml

    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "amd-pr.yml").read_text())
    steps = workflow["jobs"]["baselines"]["steps"]
    (script,) = [s["run"] for s in steps if "miles-amd baseline diff" in s.get("run", "")]
    work = tmp_path / "checkout"
    for tree in (work, work / ".reviewed"):
        shutil.copytree(BASELINES, tree / "baselines")
        manifest = tree / "src" / "miles_amd" / "baseline" / "shipped.py"
        manifest.parent.mkdir(parents=True)
        shutil.copy(REPO / "src" / "miles_amd" / "baseline" / "shipped.py", manifest)
    for under, doc in pr_patched.items():
        (work / "baselines" / under).mkdir(parents=True, exist_ok=True)
        (work / "baselines" / under / "patched.json").write_text(json.dumps(doc))
    summary = tmp_path / "summary.md"
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "GITHUB_STEP_SUMMARY": str(summary), "PATH": path}
    result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    return result, summary.read_text()


@pytest.mark.parametrize(
    ("patched", "code", "said"),
    [
        (None, 0, "Baselines: as on the base branch."),
        ({"name": "patched"}, 2, "(miles-amd baseline diff exited 2; its error is above)"),
    ],
)
def test_the_review_step_passes_unchanged_baselines_and_fails_one_that_does_not_load(
    tmp_path: Path, patched: dict | None, code: int, said: str
) -> None:
    result, summary = run_review_step(tmp_path, {SHIPPED_UNDER: patched} if patched else {})
    assert result.returncode == code, result.stderr
    assert said in summary


def test_the_review_step_shows_the_diff_and_warns_named(tmp_path: Path) -> None:
    """A pull request deleting the reward rules and adding an MI350X baseline (a new key,
    shown against the 8gpu/mi355x patched one): its summary shows `baseline diff` base ->
    pull request naming the removed rules, and the step warns "baselines changed" without
    failing (the code owners' review holds the merge, no admin override)."""
    new_key = shipped_doc("patched")
    new_key["description"] = "recorded from three MI350X nights"
    result, summary = run_review_step(tmp_path, {
        SHIPPED_UNDER: without_rules(shipped_doc("patched"), REWARD_RULES),
        Path("gpt_oss_20b_lora/8gpu/mi350x"): new_key,
    })  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "::warning title=baselines changed: review needed::baselines differ" in result.stdout
    assert "### baselines changed: review needed" in summary
    assert "#### 8gpu/mi355x/patched.json" in summary and "stock.json" not in summary
    assert "#### 8gpu/mi350x/patched.json" in summary, summary
    for rule in REWARD_RULES:
        assert rule in summary, summary
    assert "exited" not in summary, summary  # the diff itself ran
