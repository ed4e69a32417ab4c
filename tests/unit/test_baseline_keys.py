"""Baselines keyed by shape, GPU model and variant; record-only keys; a baseline from history.

Each run dir is written as a node leaves it: miles' formats by the real writers
(``tests.run_dirs.write_run``), env.json by the preflight's own writer, plan.json from the
real launch plan. The command line runs in-process (``tests.cli_runs.run_cli``) with the real
history store (SQLite) and the shipped baselines, copied where a test adds a reviewed one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from miles_amd.baseline.record import MIN_TRUSTED_RUNS
from miles_amd.history.store import HistoryStore
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


def gate_auto(run_dir: Path, history: Path | None = None, **env: str) -> CliRun:
    args = ["gate", "--run-dir", str(run_dir), "--baseline", "auto", "--format", "json"]
    args += ["--history", str(history)] if history else ["--no-history"]
    return run_cli(*args, env={**os.environ, **env})


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report" / "report.json").read_text(encoding="utf-8"))


def test_auto_judges_a_run_with_the_reviewed_baseline_of_its_key(tmp_path: Path) -> None:
    run_dir = node_run(tmp_path / "run", model="MI355X")
    done = gate_auto(run_dir)
    assert done.returncode == 0, done.stderr
    assert "no reviewed baseline" not in done.stdout + done.stderr
    checks = {c["name"]: c for c in report(run_dir)["checks"]}
    assert checks["logprob_abs_diff.mean"]["status"] == "pass"  # the band judged it
    assert report(run_dir)["baseline"]["matches_shipped"] is True


def test_a_key_without_a_reviewed_baseline_is_record_only_and_its_evidence_judged(
    tmp_path: Path,
) -> None:
    run_dir, history = node_run(tmp_path / "run"), tmp_path / "history.sqlite"
    done = gate_auto(run_dir, history)
    assert done.returncode == 0, done.stderr
    assert RECORD_ONLY in done.stderr
    verdict = report(run_dir)
    checks = {c["name"]: c for c in verdict["checks"]}
    statistical = ("mean", "max", "trend", "step")
    for name in [f"logprob_abs_diff.{rule}" for rule in statistical] + ["raw_reward.mean"]:
        assert checks[name]["status"] == "not_measured", checks[name]
        assert checks[name]["detail"] == RECORD_ONLY
    # the evidence checks judge as always: the spikes, finiteness, steps, the environment
    assert checks["logprob_abs_diff.spikes"]["status"] == "pass"
    assert checks["logprob_abs_diff.finite"]["status"] == "pass"
    assert checks["environment.identity"]["status"] == "pass"
    assert MI350X_KEY in verdict["reason"]
    with HistoryStore(history, read_only=True) as store:
        kept = store.runs()
    assert [(r.variant, r.verdict, r.run_dir) for r in kept] == [
        ("patched", "pass", str(run_dir.resolve()))
    ]
    spiked = node_run(tmp_path / "spiked", scale=12.0)  # every rollout's gap above 0.15
    assert gate_auto(spiked).returncode == 1
    failed = {c["name"] for c in report(spiked)["checks"] if c["status"] == "fail"}
    assert failed == {"logprob_abs_diff.spikes"}  # the bands are recorded, not judged


@pytest.mark.parametrize(
    ("node", "loop", "code", "phrase"),
    [
        ({"gpus": 4, "model": "MI355X"}, False, 0,
         "no reviewed baseline for 4gpu/mi355x/patched: recorded, not judged"),
        ({"model": None}, False, 2,
         "miles-amd: error: --baseline auto: {run}: env.json records no gpu_model (the GPU is "
         "unknown)"),
        ({"model": "MI355X"}, True, 2, "$MILES_AMD_BASELINES_DIR {tmp}/a: cannot be followed"),
    ],
)  # fmt: skip
def test_auto_names_a_key_it_cannot_judge(
    tmp_path: Path, node: dict, loop: bool, code: int, phrase: str
) -> None:
    """A shape without a baseline is record-only under its own key; an unknown GPU or a
    looping baselines dir is one line and judges nothing."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    run_dir = node_run(tmp_path / "run", **node)
    env = {"MILES_AMD_BASELINES_DIR": str(tmp_path / "a")} if loop else {}
    done = gate_auto(run_dir, None, **env)
    assert done.returncode == code, done.stderr
    assert phrase.format(run=run_dir, tmp=tmp_path) in done.stderr, done.stderr
    if code == 2:
        assert len(done.stderr.strip().splitlines()) == 1
        assert not (run_dir / "report").exists()


def test_a_baseline_of_one_gpu_never_judges_another(tmp_path: Path) -> None:
    run_dir = node_run(tmp_path / "run")  # MI350X, judged by the MI355X file by name
    done = run_cli("gate", "--run-dir", str(run_dir), "--baseline", "patched", "--no-history")
    assert done.returncode == 1, done.stderr
    identity = {c["name"]: c for c in report(run_dir)["checks"]}["environment.identity"]
    assert identity["status"] == "fail"
    assert "gpu_model: run MI350X, baseline MI355X" in identity["detail"]


def record_from(history: Path, out: Path) -> CliRun:
    return run_cli(
        "baseline", "record", "--from-history", str(history), "--key", MI350X_KEY,
        "--out", str(out),
    )  # fmt: skip


def nights(tmp_path: Path, scales: list[float]) -> tuple[Path, list[Path]]:
    """Runs of the MI350X key, each gated with --baseline auto into one history."""
    history, runs = tmp_path / "history.sqlite", []
    for night, scale in enumerate(scales):
        run_dir = node_run(tmp_path / f"night{night}", scale=scale, job_id=f"raysubmit_n{night}")
        assert gate_auto(run_dir, history).returncode == 0
        runs.append(run_dir)
    return history, runs


def test_too_few_or_disagreeing_trusted_runs_record_nothing(tmp_path: Path) -> None:
    history, runs = nights(tmp_path, [1.0, 1.5])  # record-only passes both
    out = tmp_path / "review" / "8gpu" / "mi350x" / "patched.json"
    done = record_from(history, out)
    assert done.returncode == 2, done.stdout
    assert f"2 trusted run(s) of {MI350X_KEY}; a baseline needs {MIN_TRUSTED_RUNS}" in done.stderr
    third = node_run(tmp_path / "night2", scale=1.02, job_id="raysubmit_n2")
    assert gate_auto(third, history).returncode == 0
    done = record_from(history, out)
    assert done.returncode == 2, done.stdout
    assert f"({runs[1]}), a trusted run of {MI350X_KEY}, fails the baseline" in done.stderr
    assert "logprob_abs_diff.mean" in done.stderr
    assert not out.exists()


def test_a_baseline_from_the_trusted_runs_of_a_key_then_judges_that_key(tmp_path: Path) -> None:
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
    judged = gate_auto(runs[0], MILES_AMD_BASELINES_DIR=str(tree))
    assert judged.returncode == 0, judged.stderr
    assert "no reviewed baseline" not in judged.stderr
    checks = {c["name"]: c for c in report(runs[0])["checks"]}
    assert checks["logprob_abs_diff.mean"]["status"] == "pass"
    assert checks["environment.identity"]["status"] == "pass"


def test_the_control_arm_takes_stocks_key_and_its_baseline_free_checks(tmp_path: Path) -> None:
    run_dir = node_run(tmp_path / "run", model="MI355X", variant="rccl")
    done = gate_auto(run_dir)
    assert done.returncode == 0, done.stderr
    verdict = report(run_dir)
    assert verdict["baseline"]["name"] == "stock" and "no reviewed baseline" not in done.stderr
    mean = {c["name"]: c for c in verdict["checks"]}["logprob_abs_diff.mean"]
    assert mean["status"] == "not_measured" and "rccl control arm" in mean["detail"]
