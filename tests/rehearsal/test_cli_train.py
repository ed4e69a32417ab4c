"""``miles-amd train --run-dir DIR --gate patched`` as a user runs it, end to end on CPU.

The only stand-in is miles' checkout: its ``train.py`` hands the recipe argv it receives,
unchanged, to the replay of the embedded run. Everything else is the real CLI: input
checks, its own Ray head on 127.0.0.1 (no ``RAY_ADDRESS``) or a named cluster (the session
head as ``RAY_ADDRESS``), the Jobs SDK, the watcher, the gate and the exit code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.history.store import HistoryStore
from miles_amd.recipe.plan import RAY_HEAD_STATE_FILE
from miles_amd.records.job import JobRecord
from miles_amd.run_dir import RunDir
from tests.support.rehearsal import EXAMPLE_RUN
from tests.unit.test_cli_plan import inputs

pytestmark = pytest.mark.rehearsal

FAKE_TRAIN = """\
import runpy, sys
# miles_amd_rehearsal_job: the recipe argv goes to the replay unchanged
sys.argv = [sys.argv[0], "--replay-source", {source!r}, "--replay-pace", "0"] + sys.argv[1:]
runpy.run_module("miles_amd.testing.replay", run_name="__main__")
"""


def train(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    """``miles-amd train --gate patched`` on fake inputs whose ``train.py`` replays the example."""
    given = inputs(tmp_path)
    (tmp_path / "miles" / "train.py").write_text(FAKE_TRAIN.format(source=str(EXAMPLE_RUN)))
    env = {k: v for k, v in env.items() if k not in ("WANDB_API_KEY", "MILES_AMD_HISTORY")}
    # The job runs `python3`: make it this interpreter, as an activated venv would.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)  # the tool's state file goes to ~/.cache/miles_amd
    command = [
        sys.executable, "-m", "miles_amd.cli", "train", *given,
        "--num-gpus", "8", "--run-dir", str(tmp_path / "run"),
        "--gate", "patched", "--timeout", "180", *extra,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def report_verdict(run_dir: Path) -> str:
    assert JobRecord.from_json(RunDir(run_dir).job_json.read_text()).status == "SUCCEEDED"
    verdict: str = json.loads((RunDir(run_dir).report / "report.json").read_text())["verdict"]
    return verdict


def test_train_with_its_own_head_passes_and_stops_the_head(tmp_path: Path) -> None:
    """No ``RAY_ADDRESS``: the CLI starts its own head, gates the run once, stops the head."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = train(tmp_path, env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "gate: PASS" in done.stdout
    assert report_verdict(tmp_path / "run") == "pass"
    assert not (tmp_path / ".cache" / "miles_amd" / RAY_HEAD_STATE_FILE).exists()
    assert not list(tmp_path.rglob("*.sqlite")), "a history nobody named was written"


def test_train_on_a_cluster_with_require_env_fails_once_everywhere(
    cluster_env: dict[str, str], tmp_path: Path
) -> None:
    """On a named cluster (the session head), with ``--require-env`` and no env.json (no
    preflight ran), the run is judged once: the verdict is fail, and the exit code, the
    report and the named history all say so."""
    history = tmp_path / "history.sqlite"
    done = train(tmp_path, cluster_env, "--require-env", "--history", str(history))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "gate: FAIL" in done.stdout
    assert report_verdict(tmp_path / "run") == "fail"
    assert f"history: appended as run 1 to {history}" in done.stdout
    with HistoryStore(history, read_only=True) as store:
        (run,) = store.runs()
    # a CPU rehearsal has no env.json, no SGLang [AR] line, no canary.json (no --aiter-variant:
    # train ran no canary), only the job's aiter fingerprint, no built model: none is proven
    assert (run.verdict, run.failed_checks) == (
        "fail",
        (
            "environment.identity",
            "allreduce.path",
            "allreduce.canary",
            "allreduce.fix",
            "model.lora_experts",
        ),
    )
