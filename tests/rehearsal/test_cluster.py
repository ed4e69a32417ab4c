"""Cluster mode on a real two-node Ray cluster (one CPU machine, two raylets, fake MI355X nodes).

Both runs replay the example concurrently, each pinned to its own node by the node resource,
each writing its evidence into a dir private to its node; the evidence is pulled back with
verified sizes and sha256 and gated. The node-loss fault kills the joined node's raylet by
pid mid-run: that run ends red with a named reason, the other's verdict stays PASS. Every
process of both nodes is checked gone, by pid, at the end. (A cluster without a suitable node:
``test_ray_endpoint``, against the State API reply of Ray 2.60.)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from miles_amd.app.baselines import load, watch_rules
from miles_amd.app.gate import gate_run_dir
from miles_amd.app.train import TrainResult
from miles_amd.recipe.plan import NODE_ROOT_VAR, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.records.job import JobRecord
from miles_amd.run.dashboard import auth_headers
from miles_amd.run.driver import RunOutcome, execute
from miles_amd.run.variants_run import PATCHED_DIR_VAR, execute_variants, variant_env
from miles_amd.run_dir import RunDir
from tests.support.rehearsal import EXAMPLE_RUN, replay_prefix
from tests.support.two_node import TwoNodeCluster, start_cluster

pytestmark = pytest.mark.rehearsal


@pytest.fixture(scope="module")
def cluster() -> Iterator[TwoNodeCluster]:
    started = start_cluster(os.environ)
    try:
        yield started
    finally:
        started.stop()
        left = started.leftovers()
        assert not left, f"processes of the two nodes left: {[p.pid for p in left]}"


def plans_for(
    cluster: TwoNodeCluster, tmp_path: Path, pace_s: float, faults: dict[str, str] | None = None
) -> dict:
    """Both variants' plans; ``faults`` names a variant's replay fault (at rollout 0)."""
    env = {**cluster.client_env(os.environ), PATCHED_DIR_VAR: str(tmp_path / "aiter-patched")}
    tag = uuid.uuid4().hex[:8]  # node dirs outlive a test: each run its own
    faults = faults or {}
    return {
        variant: build_train_plan(
            Recipe(num_rollout=20),
            variant_env(env, variant),
            run_dir=str(tmp_path / variant),
            entrypoint_prefix=replay_prefix(
                EXAMPLE_RUN, pace_s=pace_s, fault=faults.get(variant), at=0
            ),
            node_root="${" + NODE_ROOT_VAR + "}",
            run_id=tag,
            aiter_variant=variant,  # as `train --variants` plans each (cli/variants.py)
        )
        for variant in ("stock", "patched")
    }


def execute_both(plans: dict, tmp_path: Path) -> dict:
    """Both variants at once; the replay is the patched example, so both gate as patched."""
    patched = load("patched", "--gate")
    outcomes = execute_variants(
        plans,
        {variant: watch_rules(patched) for variant in plans},
        timeout_s=240,
        watch_interval_s=2.0,
        state_dir=str(tmp_path / "s"),
        echo=lambda _line: None,
    )
    return {
        v: TrainResult(o, gate_run_dir(o.run_dir, patched)) if isinstance(o, RunOutcome) else o
        for v, o in outcomes.items()
    }


def run_both(cluster: TwoNodeCluster, tmp_path: Path, pace_s: float, during=None) -> dict:
    """Both variants at once, in a thread while ``during`` runs."""
    plans = plans_for(cluster, tmp_path, pace_s)
    results: dict = {}
    runner = threading.Thread(target=lambda: results.update(execute_both(plans, tmp_path)))
    runner.start()
    if during is not None:
        during()
    runner.join(timeout=300)
    return results


def node_of(cluster: TwoNodeCluster, run_dir: Path) -> list[int]:
    """Indexes of the nodes whose private root holds the run's evidence dir."""
    return [i for i, n in enumerate(cluster.nodes) if list(n.node_root.glob(f"{run_dir.name}-*"))]


def test_two_runs_concurrent_pinned_pulled_back_and_gated(cluster, tmp_path) -> None:
    results = run_both(cluster, tmp_path, pace_s=0.3)
    for name in ("stock", "patched"):
        result = results[name]
        assert isinstance(result, TrainResult), result
        assert result.verdict == "pass", result.summary()
        assert result.outcome.pullback_error is None
    records = {
        n: json.loads(RunDir(tmp_path / n).pullback_json.read_text()) for n in ("stock", "patched")
    }
    assert {r["status"] for r in records.values()} == {"verified"}
    assert records["stock"]["node_id"] != records["patched"]["node_id"], "both on one node"
    patched_path = json.loads((tmp_path / "patched" / "plan.json").read_text())["job"]
    entries = patched_path["runtime_env"]["env_vars"]["PYTHONPATH"].split(":")
    assert str(tmp_path / "aiter-patched") in entries  # ahead of site-packages' stock aiter
    assert sorted(
        node_of(cluster, tmp_path / "stock") + node_of(cluster, tmp_path / "patched")
    ) == [0, 1]
    for name, record in records.items():
        assert any(path.startswith("tensorboard/") for path in record["files"])
        assert any(path.startswith("ci_history/") for path in record["files"])
        for path, meta in record["files"].items():
            data = (tmp_path / name / path).read_bytes()
            assert len(data) == meta["size"]
            assert hashlib.sha256(data).hexdigest() == meta["sha256"]


def test_a_variant_stopped_at_a_look_leaves_the_other_running(cluster, tmp_path) -> None:
    """Stock's replay has its KL doubled: its driver stops it at a look before rollout 20;
    patched's job, on the other node, runs to its end and passes. Paced at 1 s a rollout: in
    cluster mode each watcher poll pulls the evidence with a Ray job, and at 0.5 s a loaded
    machine let the job finish (SUCCEEDED, stopped_by "look") before the stop arrived."""
    results = execute_both(plans_for(cluster, tmp_path, 1.0, {"stock": "kl-doubled"}), tmp_path)
    stopped, kept = results["stock"], results["patched"]
    assert isinstance(stopped, TrainResult) and isinstance(kept, TrainResult), results
    job = JobRecord.from_json(RunDir(tmp_path / "stock").job_json.read_text())
    assert (job.status, job.stopped_by) == ("STOPPED", "look")
    assert job.look is not None and job.look.rule == "train_rollout_kl.mean"
    assert job.look.rollout < 20 and stopped.verdict == "fail"
    assert "step 19:" not in RunDir(tmp_path / "stock").job_log.read_text()
    outcome = kept.outcome
    assert (outcome.status, outcome.stopped_by, kept.verdict) == ("SUCCEEDED", None, "pass")
    assert "step 19:" in RunDir(tmp_path / "patched").job_log.read_text()


def test_ctrl_c_stops_both_variants(cluster, tmp_path) -> None:
    """Ctrl-C (a real SIGINT) once both jobs stream their logs (not after a fixed delay: on a
    loaded machine the node check and submission alone can outlast any fixed delay). Both
    job.json files are there when KeyboardInterrupt comes out: a clean ``.ci/run`` once found
    stock's missing, its driver still stopping the job (``run_each``: cpython#90882)."""
    plans = plans_for(cluster, tmp_path, pace_s=1.0)
    logs = [RunDir(tmp_path / variant).job_log for variant in plans]

    def interrupt_once_both_run() -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if all(log.exists() and log.stat().st_size > 0 for log in logs):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=interrupt_once_both_run, daemon=True)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        execute_both(plans, tmp_path)
    for variant in plans:
        job = JobRecord.from_json(RunDir(tmp_path / variant).job_json.read_text())
        assert (job.status, job.stopped_by) == ("STOPPED", "interrupt"), variant
        assert "before the job was submitted" not in job.message, job


def test_interrupt_before_submission_still_writes_job_json(cluster, tmp_path) -> None:
    """The early window: cancelled before the job is submitted, nothing is submitted and
    job.json still says the run was stopped by an interrupt."""
    plan = plans_for(cluster, tmp_path, pace_s=1.0)["stock"]
    cancel = threading.Event()
    cancel.set()
    outcome = execute(
        plan, timeout_s=60, state_dir=str(tmp_path / "s"), echo=lambda _l: None, cancel=cancel
    )
    job = JobRecord.from_json(RunDir(tmp_path / "stock").job_json.read_text())
    assert (job.status, job.stopped_by) == ("STOPPED", "interrupt")
    assert "nothing ran" in job.message and outcome.exit_code != 0
    from ray.job_submission import JobSubmissionClient

    headers = auth_headers(cluster.token_path.read_text().strip())
    jobs = JobSubmissionClient(cluster.dashboard_url, headers=headers).list_jobs()
    assert job.job_id not in {j.submission_id for j in jobs}


def test_node_lost_mid_run_ends_that_run_red_and_keeps_the_other(cluster, tmp_path) -> None:
    joined = cluster.nodes[1]

    def kill_joined_node_mid_run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            events = list(joined.node_root.glob("*/tensorboard/**/events.*"))
            if events and any(p.stat().st_size > 2000 for p in events):
                joined.kill()
                return
            time.sleep(0.3)
        raise AssertionError("no run reached the joined node")

    results = run_both(cluster, tmp_path, pace_s=0.5, during=kill_joined_node_mid_run)
    outcomes = {name: r for name, r in results.items() if isinstance(r, TrainResult)}
    assert len(outcomes) == 2, results
    lost = [o for o in outcomes.values() if o.outcome.status == "FAILED"]
    kept = [o for o in outcomes.values() if o.outcome.status == "SUCCEEDED"]
    assert len(lost) == 1 and len(kept) == 1, [o.summary() for o in outcomes.values()]
    assert lost[0].exit_code != 0 and lost[0].verdict != "pass"
    error = lost[0].outcome.pullback_error
    assert error and "pull-back failed" in error
    record = json.loads(RunDir(lost[0].outcome.run_dir).pullback_json.read_text())
    assert record["status"] == "failed" and record["reason"] == error
    assert kept[0].verdict == "pass", kept[0].summary()
    assert joined.leftovers() == []
