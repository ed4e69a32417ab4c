"""Baselines keyed by shape, GPU model and variant; record-only keys; a baseline from history.

Each run dir is written as a node leaves it (miles' formats by the real writers, env.json by
the preflight's writer, plan.json from the real launch plan); ``--baseline auto`` is judged
through ``app.gate.choose_baseline`` and the gate, the history is the real SQLite store, and
``baseline record --from-history`` runs in-process.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from miles_amd.app import AppError
from miles_amd.app.gate import choose_baseline
from miles_amd.baseline.model import load_baseline
from miles_amd.baseline.record import MIN_TRUSTED_RUNS
from miles_amd.evidence.load import load_run
from miles_amd.history.entry import history_record
from miles_amd.history.store import HistoryStore
from miles_amd.judge.gate import Verdict, judge
from miles_amd.recipe.plan import build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.preflight import Fact, write_env_json
from tests.bridge_readings import node_model_facts
from tests.cli_runs import CliRun, run_cli
from tests.constants import BASELINES, LOGPROB
from tests.run_dirs import published_values, write_run

pytestmark = pytest.mark.unit

MI350X_KEY = "8gpu/mi350x/patched"
RECORD_ONLY = f"no reviewed baseline for {MI350X_KEY}: recorded, not judged"


def node_run(
    where: Path,
    *,
    gpus: int = 8,
    model: str | None = "MI350X",
    scale: float = 1.0,
    job_id: str = "raysubmit_a",
    variant: str = "patched",
) -> Path:
    """A finished run of ``gpus`` GPUs of ``model`` (None: an env.json without the fact),
    its logprob gap ``scale`` times jvvnhop9's."""
    values = published_values()
    values[LOGPROB] = [v * scale for v in values[LOGPROB]]
    run_dir = write_run(where, values, job_id=job_id)
    facts = [
        Fact("gpus", "ok", f"{gpus}x gfx950 (torch)"),
        *([Fact("gpu_model", "ok", model)] if model else []),
        Fact("rocm", "ok", "7.2.0-43 (/opt/rocm/.info/version)"),
        Fact("aiter", "ok", "amd-aiter 0.1.5 (commit 1a2b3c4)"),
        Fact("aiter_variant", "ok", variant),
        *node_model_facts(),
    ]
    write_env_json(facts, run_dir, {"host": "node-1"})
    plan = build_train_plan(
        Recipe(num_gpus=gpus), {"PATH": "/usr/bin"}, run_dir=str(run_dir), aiter_variant=variant
    )
    (run_dir / "plan.json").write_text(json.dumps(plan.to_dict()), encoding="utf-8")
    return run_dir


def gate_auto(run_dir: Path, history: Path | None = None) -> Verdict:
    """What ``gate --baseline auto`` judges (and appends), without its report files."""
    evidence = load_run(run_dir)
    baseline, record_only = choose_baseline(evidence)
    verdict = judge(evidence, baseline, record_only=record_only)
    if history is not None:
        with HistoryStore(history) as store:
            store.append(history_record(verdict, evidence, baseline, environ={}))
    return verdict


def checks(verdict: Verdict) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.detail) for c in verdict.checks}


def test_auto_judges_a_run_with_the_reviewed_baseline_of_its_key(tmp_path: Path) -> None:
    verdict = gate_auto(node_run(tmp_path / "run", model="MI355X"))
    assert verdict.verdict == "pass" and verdict.record_only is None
    assert checks(verdict)["logprob_abs_diff.mean"][0] == "pass"  # the band judged it


def test_a_key_without_a_reviewed_baseline_is_record_only_and_its_evidence_judged(
    tmp_path: Path,
) -> None:
    run_dir, history = node_run(tmp_path / "run"), tmp_path / "history.sqlite"
    verdict = gate_auto(run_dir, history)
    assert verdict.verdict == "pass" and MI350X_KEY in verdict.reason
    found = checks(verdict)
    statistical = ("mean", "max", "trend", "step")
    for name in [f"logprob_abs_diff.{rule}" for rule in statistical] + ["raw_reward.mean"]:
        assert found[name] == ("not_measured", RECORD_ONLY), found[name]
    # the evidence checks judge as always: the spikes, finiteness, steps, the environment
    for name in ("logprob_abs_diff.spikes", "logprob_abs_diff.finite", "environment.identity"):
        assert found[name][0] == "pass", found[name]
    with HistoryStore(history, read_only=True) as store:
        kept = store.runs()
    assert [(r.variant, r.verdict, r.run_dir) for r in kept] == [
        ("patched", "pass", str(run_dir.resolve()))
    ]
    spiked = gate_auto(node_run(tmp_path / "spiked", scale=12.0))  # every gap above 0.15
    assert [c.name for c in spiked.failures] == ["logprob_abs_diff.spikes"]


@pytest.mark.parametrize(
    ("node", "loop", "phrase"),
    [
        ({"gpus": 4, "model": "MI355X"}, False,
         "no reviewed baseline for 4gpu/mi355x/patched: recorded, not judged"),
        ({"model": None}, False,
         "--baseline auto: {run}: env.json records no gpu_model (the GPU is unknown)"),
        ({"model": "MI355X"}, True, "$MILES_AMD_BASELINES_DIR {tmp}/a: cannot be followed"),
    ],
)  # fmt: skip
def test_auto_names_a_key_it_cannot_judge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node: dict, loop: bool, phrase: str
) -> None:
    """A shape without a baseline is record-only under its own key; an unknown GPU or a
    looping baselines dir is one line naming it (the CLI's exit 2)."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    run_dir = node_run(tmp_path / "run", **node)
    if loop:
        monkeypatch.setenv("MILES_AMD_BASELINES_DIR", str(tmp_path / "a"))
    expected = phrase.format(run=run_dir, tmp=tmp_path)
    if "recorded, not judged" in phrase:
        assert expected in {c.detail for c in gate_auto(run_dir).checks}
        return
    with pytest.raises(AppError) as error:
        gate_auto(run_dir)
    assert expected in str(error.value) and "\n" not in str(error.value)


def test_a_baseline_of_one_gpu_never_judges_another(tmp_path: Path) -> None:
    run_dir = node_run(tmp_path / "run")  # MI350X, judged by the MI355X file by name
    status, detail = checks(judge(load_run(run_dir), load_baseline("patched")))[
        "environment.identity"
    ]
    assert status == "fail" and "gpu_model: run MI350X, baseline MI355X" in detail


def record_from(history: Path, out: Path) -> CliRun:
    return run_cli(
        "baseline", "record", "--from-history", str(history), "--key", MI350X_KEY,
        "--out", str(out),
    )  # fmt: skip


def nights(tmp_path: Path, scales: list[float]) -> tuple[Path, list[Path]]:
    """Runs of the MI350X key, each gated record-only into one history."""
    history, runs = tmp_path / "history.sqlite", []
    for night, scale in enumerate(scales):
        run_dir = node_run(tmp_path / f"night{night}", scale=scale, job_id=f"raysubmit_n{night}")
        assert gate_auto(run_dir, history).verdict == "pass"
        runs.append(run_dir)
    return history, runs


def test_too_few_or_disagreeing_trusted_runs_record_nothing(tmp_path: Path) -> None:
    history, runs = nights(tmp_path, [1.0, 1.5])  # record-only passes both
    out = tmp_path / "review" / "8gpu" / "mi350x" / "patched.json"
    done = record_from(history, out)
    assert done.returncode == 2, done.stdout
    assert f"2 trusted run(s) of {MI350X_KEY}; a baseline needs {MIN_TRUSTED_RUNS}" in done.stderr
    third = node_run(tmp_path / "night2", scale=1.02, job_id="raysubmit_n2")
    assert gate_auto(third, history).verdict == "pass"
    done = record_from(history, out)
    assert done.returncode == 2, done.stdout
    assert f"({runs[1]}), a trusted run of {MI350X_KEY}, fails the baseline" in done.stderr
    assert "logprob_abs_diff.mean" in done.stderr
    assert not out.exists()


def test_a_baseline_from_the_trusted_runs_of_a_key_then_judges_that_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history, runs = nights(tmp_path, [1.03, 0.97, 1.0])
    out = tmp_path / "review" / "8gpu" / "mi350x" / "patched.json"
    done = record_from(history, out)
    assert done.returncode == 0, done.stderr
    assert "2 other trusted runs of 8gpu/mi350x/patched pass it" in done.stdout
    recorded = json.loads(out.read_text(encoding="utf-8"))
    assert recorded["provenance"]["run_id"] == "raysubmit_n2"  # the median run's
    assert recorded["provenance"]["environment"]["gpu_model"] == "MI350X"
    # reviewed: in the baselines tree at its key, it judges the key's runs (not record-only)
    tree = tmp_path / "baselines"
    shutil.copytree(BASELINES, tree)
    (tree / "gpt_oss_20b_lora" / MI350X_KEY).parent.mkdir(parents=True)
    shutil.copy(out, tree / "gpt_oss_20b_lora" / f"{MI350X_KEY}.json")
    monkeypatch.setitem(os.environ, "MILES_AMD_BASELINES_DIR", str(tree))
    judged = gate_auto(runs[0])
    assert judged.verdict == "pass" and judged.record_only is None
    found = checks(judged)
    assert found["logprob_abs_diff.mean"][0] == found["environment.identity"][0] == "pass"


def test_the_control_arm_takes_stocks_key_and_its_baseline_free_checks(tmp_path: Path) -> None:
    verdict = gate_auto(node_run(tmp_path / "run", model="MI355X", variant="rccl"))
    assert verdict.verdict == "pass" and verdict.baseline_name == "stock"
    assert verdict.record_only is None
    status, detail = checks(verdict)["logprob_abs_diff.mean"]
    assert status == "not_measured" and "rccl control arm" in detail
