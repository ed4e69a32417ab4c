"""The rehearsal with miles' own writers (``--replay-writers real``): the same verdicts, failing
checks and driver stops as the imitation, and on the same values the same event files (wall
time aside), CI-history text and metric lines (pids and stamps masked). Needs miles' source in
``$MILES_AMD_MILES_SRC`` and torch + sglang here (docs/rehearsal.md, "The real writers").
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
from collections import defaultdict
from pathlib import Path
from unittest import mock

import pytest

from miles_amd.app.train import TrainResult
from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.recipe.settings import Recipe
from miles_amd.testing.faults import FAULTS
from miles_amd.testing.miles_writer import ActorPids, MilesRunWriter
from miles_amd.testing.replay import MILES_SRC_ENV, main
from tests.support.rehearsal import EXAMPLE_RUN, expectation_problems, rehearse

MILES_SRC = os.environ.get(MILES_SRC_ENV, "")
_MISSING = [name for name in ("torch", "sglang") if importlib.util.find_spec(name) is None]
pytestmark = [
    pytest.mark.conformance,
    pytest.mark.skipif(
        not Path(MILES_SRC, "miles").is_dir() or bool(_MISSING),
        reason=(
            f"needs miles' source in ${MILES_SRC_ENV} and torch + sglang in this Python "
            f"(missing: {', '.join(_MISSING) or 'none'}): run `.ci/conformance-env && source "
            ".conformance/env.sh && $MILES_AMD_MILES_PYTHON -m pip install -e '.[test]' "
            "-r requirements/real-writers.txt`, then `$MILES_AMD_MILES_PYTHON -m pytest -m "
            "conformance tests/rehearsal/test_real_writers.py` (README: Conformance)"
        ),
    ),
]

EVIDENCE_FAULTS = (
    None, "spike", "nan", "short", "reward-collapse", "truncated-event", "fatal-sentinel",
)  # fmt: skip
WATCH_INTERVAL_S = 2.0
IMPORTS = Path(__file__).resolve().parents[1] / "conformance" / "import_stubs"  # inert triton


def real_run(cluster_env, tmp_path: Path, **kwargs) -> TrainResult:
    """A replay through the driver, watcher and gate with miles' writers."""
    env = dict(cluster_env)
    if importlib.util.find_spec("triton") is None:  # sglang imports triton and torchvision
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(IMPORTS)]))
    return rehearse(
        env, tmp_path / "real", writers="real", miles_src=MILES_SRC,
        state_dir=str(tmp_path / "state"), timeout_s=240.0, **kwargs,
    )  # fmt: skip


def imitation_of(real: Path, source: Path, rollouts: int, *options: str) -> Path:
    """The same replay with the imitation writer, in process (no Ray: the writer is the subject),
    beside ``real`` with its job.json."""
    run_dir = real.with_name("imitation")
    argv = ["--replay-source", str(source), "--replay-pace", "0", *options]
    dirs = {"TENSORBOARD_DIR": "tensorboard", "MILES_CI_GATE_RECORD_DIR": "ci_history"}
    run_dir.mkdir()
    with (
        mock.patch.dict(os.environ, {k: str(run_dir / v) for k, v in dirs.items()}),
        (run_dir / "job.log").open("w") as log,
        contextlib.redirect_stdout(log),
    ):
        assert main([*argv, *Recipe(num_rollout=rollouts, capture_metrics=True).argv()]) == 0
    shutil.copy(real / "job.json", run_dir / "job.json")
    return run_dir


def failed_on_common_rollouts(*run_dirs: Path) -> list[set[str]]:
    """Each run's failed checks on the rollouts all of them wrote (fail-fast stops differ)."""
    runs = [load_run(run_dir) for run_dir in run_dirs]
    last = min(series[-1][0] for run in runs for series in run.series.values() if series)
    judged = []
    for run in runs:
        common = {m: tuple(p for p in s if p[0] <= last) for m, s in run.series.items()}
        verdict = judge(dataclasses.replace(run, series=common), load_baseline("patched"))
        judged.append({check.name for check in verdict.checks if check.failed})
    return judged


@pytest.mark.parametrize("fault", EVIDENCE_FAULTS, ids=lambda f: f or "healthy")
def test_verdicts_match_with_real_writers(fault, cluster_env, tmp_path) -> None:
    """The real run ends as ``FAULTS`` says (as the imitation's does in test_rehearsal), and
    fails the same checks as the imitation's files on the rollouts both wrote."""
    pacing: dict[str, float] = {"pace_s": 0.1}
    if fault is not None and FAULTS[fault].driver_stop in ("fail-fast", "look"):
        # the watcher must see the fault or the deciding look while the job runs
        pacing = {"pace_s": 0.5, "watch_interval_s": WATCH_INTERVAL_S}
    result = real_run(cluster_env, tmp_path, fault=fault, at=3, **pacing)
    assert expectation_problems(fault, result) == [], result
    options = ("--replay-fault", fault, "--replay-fault-at", "3") if fault else ()
    imitation = imitation_of(result.outcome.run_dir, EXAMPLE_RUN, 20, *options)
    real_failed, imitation_failed = failed_on_common_rollouts(result.outcome.run_dir, imitation)
    assert real_failed == imitation_failed


# ---- writer parity ----------------------------------------------------------------------

PARITY_ROLLOUTS = 3


def rich_metrics(k: int) -> dict[str, float]:
    return {
        "perf/rollout_time": 180.25 + k,
        "perf/tokens_per_gpu_per_sec": 512.5 + k,
        "rollout/response_len/mean": 2920.0 + 3 * k,
        "rollout/truncated_ratio": (26 + k) / 64,
        "rollout/raw_reward": (32 + 3 * k) / 64,
        "rollout/log_probs": -math.inf if k == 2 else -0.3125 - k / 64,
        "train/loss": 0.0123 + k / 1000,
        "train/pg_clipfrac": 0.0,
        "train/train_rollout_logprob_abs_diff": 0.0208 - k / 1000,
        "train/train_rollout_kl": 6.95e-4 + k * 1e-5,
        "train/ppo_kl": math.nan if k == 1 else 0.0,  # non-finite, outside the watched keys
        "train/grad_norm": 0.125 + k / 8,
        "perf/actor_train_time": 40.5 + k,
        "perf/actor_train_tok_per_s": 2048.0 + k,
        "perf/cpu_memory_after_offload_train_gb": 81.5 + k,
    }


@pytest.fixture(scope="module")
def rich_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rich")
    with (root / "job.log").open("w") as log:
        writer = MilesRunWriter(
            root / "tensorboard", root / "ci_history", log, pids=ActorPids.around(7000)
        )
        for k in range(PARITY_ROLLOUTS):
            writer.emit_rollout(k, rich_metrics(k))
        writer.close()
    (root / "job.json").write_text(json.dumps({"job_id": "raysubmit_rich", "status": "SUCCEEDED"}))
    return root


_EVENT_NAME = re.compile(r"events\.out\.tfevents\.\d{10}\.[^.]+\.\d+\.\d+")
_CI_NAME = re.compile(r"\d+-[0-9a-f]{32}\.jsonl")
_METRIC = re.compile(r"\] [\w.]+:\d+ - (?:step|rollout|perf) -?\d+: \{")
_PID = re.compile(r"pid=\d+")
_STAMP = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} ")


def event_records(path: Path) -> list[bytes]:
    """Every event serialised, its wall time (the only free field) zeroed."""
    from tensorboard.compat.proto.event_pb2 import Event

    from miles_amd.evidence.tensorboard import read_records

    out = []
    for payload in read_records(path):
        event = Event.FromString(payload)
        event.wall_time = 0.0
        out.append(event.SerializeToString())
    return out


def tensorboard_view(run_dir: Path) -> list[list[bytes]]:
    files = sorted((run_dir / "tensorboard").iterdir())
    assert all(_EVENT_NAME.fullmatch(p.name) for p in files), files
    return sorted(event_records(p) for p in files)


def ci_view(run_dir: Path) -> list[str]:
    files = sorted((run_dir / "ci_history").iterdir())
    assert all(_CI_NAME.fullmatch(p.name) for p in files), files
    return sorted(p.read_text() for p in files)


def log_view(run_dir: Path) -> dict[str, list[str]]:
    per_process: dict[str, list[str]] = defaultdict(list)
    for line in (run_dir / "job.log").read_text().splitlines():
        if _METRIC.search(line):
            masked = _STAMP.sub("[T ", _PID.sub("pid=P", line))
            per_process[masked.split(" [T ")[0]].append(masked)
    return dict(per_process)


def test_writer_parity_on_the_same_values(cluster_env, tmp_path, rich_source) -> None:
    result = real_run(cluster_env, tmp_path, source=rich_source, num_rollout=PARITY_ROLLOUTS)
    assert result.outcome.status == "SUCCEEDED", result
    real = result.outcome.run_dir
    imitation = imitation_of(real, rich_source, PARITY_ROLLOUTS)
    assert tensorboard_view(real) == tensorboard_view(imitation)
    assert ci_view(real) == ci_view(imitation)
    real_log, imitation_log = log_view(real), log_view(imitation)
    assert sum(len(v) for v in real_log.values()) == 5 * PARITY_ROLLOUTS
    assert real_log == imitation_log
    assert "cpu_memory_after_offload_train_gb" not in (real / "job.log").read_text()
