"""``miles-amd train --run-dir DIR --gate patched`` as a user runs it, end to end on CPU.

The only stand-in is miles' checkout: its ``train.py`` hands the recipe argv it receives,
unchanged, to the replay of the embedded run. Everything else is the real CLI: input
checks, its own Ray head on 127.0.0.1 (no ``RAY_ADDRESS``), the Jobs SDK, the watcher, the
gate and the exit code.
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
from miles_amd.run_dir import JobRecord, RunDir
from miles_amd.testing.rehearsal import EXAMPLE_RUN
from tests.unit.test_cli_plan import write_checkpoint

pytestmark = pytest.mark.rehearsal

FAKE_TRAIN = """\
import runpy, sys
# miles_amd_rehearsal_job: the recipe argv goes to the replay unchanged
sys.argv = [sys.argv[0], "--replay-source", {source!r}, "--replay-pace", "0"] + sys.argv[1:]
runpy.run_module("miles_amd.testing.replay", run_name="__main__")
"""


@pytest.mark.parametrize("require_env", [False, True], ids=["gate", "gate-require-env"])
def test_train_with_gate_runs_and_exits_with_the_verdict(tmp_path: Path, require_env: bool) -> None:
    """The run is judged once: with ``--require-env`` and no env.json (no preflight ran) the
    verdict is fail, and the exit code, the report and the named history all say so."""
    write_checkpoint(tmp_path / "models", mxfp4=False)
    dataset = tmp_path / "data" / "dapo-math-17k" / "dapo-math-17k.jsonl"
    dataset.parent.mkdir(parents=True)
    dataset.write_text(json.dumps({"prompt": "1+1?", "label": "2"}) + "\n")
    miles = tmp_path / "miles"
    miles.mkdir()
    (miles / "train.py").write_text(FAKE_TRAIN.format(source=str(EXAMPLE_RUN)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_API_KEY")}
    # The job runs `python3`: make it this interpreter, as an activated venv would.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)  # the tool's state file goes to ~/.cache/miles_amd
    run_dir = tmp_path / "run"
    history = tmp_path / "history.sqlite"
    extra = ["--require-env", "--history", str(history)] if require_env else []
    env.pop("MILES_AMD_HISTORY", None)  # only --history names one here
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "miles_amd.cli",
            "train",
            "--model-dir",
            str(tmp_path / "models"),
            "--data-dir",
            str(tmp_path / "data"),
            "--miles-dir",
            str(miles),
            "--num-gpus",
            "8",
            "--run-dir",
            str(run_dir),
            "--gate",
            "patched",
            "--timeout",
            "180",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    verdict = "fail" if require_env else "pass"
    assert done.returncode == (1 if require_env else 0), done.stdout[-2000:] + done.stderr[-2000:]
    assert f"gate: {verdict.upper()}" in done.stdout
    assert JobRecord.from_json(RunDir(run_dir).job_json.read_text()).status == "SUCCEEDED"
    report = json.loads((RunDir(run_dir).report / "report.json").read_text())
    assert report["verdict"] == verdict
    if require_env:
        assert f"history: appended as run 1 to {history}" in done.stdout
        with HistoryStore(history, read_only=True) as store:
            (run,) = store.runs()
        # a CPU rehearsal has no env.json, no SGLang [AR] line, no built model: none is proven
        assert (run.verdict, run.failed_checks) == (
            "fail",
            ("environment.identity", "allreduce.path", "model.lora_experts"),
        )
    else:
        assert not history.exists()
    assert not (tmp_path / ".cache" / "miles_amd" / RAY_HEAD_STATE_FILE).exists()
