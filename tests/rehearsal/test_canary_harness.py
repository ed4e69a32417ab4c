"""The canary's CPU harness for real: ``miles-amd canary --reducer`` in 4 gloo processes.

Each test runs ``python -m miles_amd.cli canary`` with an interpreter that has torch (this one,
else ``$MILES_AMD_MILES_PYTHON``); without one the tests skip saying how to get torch, unless
``MILES_AMD_REQUIRE_TORCH=1`` (``.ci/run`` sets it), when they fail. The reducers
(``tests/support/canary_reducers.py``) are clean, built like ROCm/aiter#5694's stale read, of
another shape, hung, raising, or silent; and a SIGTERM to the command. The detection power is
measured over repeats, not taken from the formula.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest
from scipy.stats import beta

from miles_amd.canary import harness
from miles_amd.canary.plan import ARMS
from miles_amd.records.canary import CanaryRecord
from tests.support.fake_aiter import fake_aiter

REDUCERS = Path(__file__).parents[1] / "support" / "canary_reducers.py"
SCHEMA = json.loads(Path(harness.__file__).with_name("canary.schema.json").read_text())
pytestmark = pytest.mark.no_ray  # starts no Ray: joins no Ray xdist group


@lru_cache(maxsize=1)
def _torch_python() -> str | None:
    for python in (sys.executable, os.environ.get("MILES_AMD_MILES_PYTHON")):
        if (
            python
            and subprocess.run(
                [python, "-c", "import torch, miles_amd.canary"], capture_output=True, check=False
            ).returncode
            == 0
        ):
            return python
    return None


@pytest.fixture
def torch_python() -> str:
    python = _torch_python()
    if python is None:
        reason = (
            "no interpreter with torch and miles_amd: pip install torch==2.13.0 into this venv, "
            "or build the conformance env (.ci/conformance-env) and source .conformance/env.sh"
        )
        if os.environ.get("MILES_AMD_REQUIRE_TORCH") == "1":
            pytest.fail(f"MILES_AMD_REQUIRE_TORCH=1 but {reason}")
        pytest.skip(reason)
    return python


def canary(python: str, func: str, args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``miles-amd canary --reducer`` of ``canary_reducers``'s ``func`` on 4 ranks."""
    argv = ["-m", "miles_amd.cli", "canary", "--reducer", f"{REDUCERS}:{func}", "--world-size", "4"]
    return subprocess.run(
        [python, *argv, *args.split()],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, **env},
    )


def test_a_clean_all_reduce_is_a_valid_record_whose_ranks_see_the_aiter_the_rule_chooses(
    torch_python: str, tmp_path: Path
) -> None:
    """gloo's all-reduce in ranks that each check they find the patched checkout (on no
    PYTHONPATH of the command's own, only AITER_PATCHED_DIR), as do the fingerprint and the
    constants."""
    entry, header = fake_aiter(tmp_path / "aiter", fixed=True, layout="checkout")
    run_dir = tmp_path / "run"
    args = f"--variant patched --detect-rate 0.02 --json --run-dir {run_dir}"
    env = {"AITER_PATCHED_DIR": str(entry), "PYTHONPATH": ""}
    done = canary(torch_python, "sees_aiter", args, **env)
    assert done.returncode == 0, done.stderr
    text = (run_dir / "canary.json").read_text(encoding="utf-8")
    assert json.loads(done.stdout) == json.loads(text)
    jsonschema.validate(json.loads(text), SCHEMA)
    record = CanaryRecord.from_json(text)
    assert record.clean and record.implementation == "reducer" and record.backend == "gloo"
    assert record.aiter_fix is not None and record.aiter_fix.startswith(f"fixed: {header} sha256:")
    assert record.dispatch_source.startswith(f"installed {header}, ")
    assert [r.tokens for r in record.results] == [e["tokens"] for e in record.plan]
    assert all(
        r.calls >= e["calls"] and r.latency_us
        for r, e in zip(record.results, record.plan, strict=True)
    )
    assert record.power.exposed_calls >= 228 and record.power.probability >= 0.99
    assert {r.kernel for r in record.results} == {"1stage", "2stage"}
    assert {r.wave_class for r in record.results} >= {"exposed", "uniform", "not-2stage"}
    for result in record.results:  # every arm ran, in blocks, with its own counts
        assert {a.arm for a in result.arms} == set(ARMS)
        assert all(a.calls and a.blocks for a in result.arms)
        assert result.block_rate_upper_99 is not None and result.rate_upper_99 is not None


def test_a_stale_read_at_the_stated_rate_is_caught_at_the_stated_power_with_its_fingerprint(
    torch_python: str,
) -> None:
    """Per-call rate 0.5 at N=127 (exposed) and a budget for 0.5 at 99 %: 7 calls a repeat (8 over
    the four arms). Over 60 repeats the detection fraction is measured; a harness that missed the
    corruption, or looked at too few elements, would show it."""
    repeats = 60
    args = f"--tokens 127 --detect-rate 0.5 --repeats {repeats} --json"
    seeded = {"CANARY_TEST_RATE": "0.5", "CANARY_TEST_SEED": "20261202"}
    done = canary(torch_python, "stale", args, **seeded)
    assert done.returncode == 1, done.stderr
    assert "matches ROCm/aiter#5694's stale read" in done.stderr
    assert "N=127 (2stage, exposed)" in done.stderr
    record = CanaryRecord.from_json(done.stdout)
    (result,) = record.results
    assert result.calls == 8 * repeats and record.power.exposed_calls == 8
    detected = record.repeats_with_mismatch
    # one-sided Clopper-Pearson: the power is >= 0.9 at 95 % confidence
    assert beta.ppf(0.05, detected, repeats - detected + 1) >= 0.9, detected
    assert repeats - detected <= 3, detected  # P(>= 4 misses | power 0.996) < 0.2 %
    assert 0.35 * result.calls <= result.mismatches <= 0.65 * result.calls
    assert result.fingerprint == "stale-read" and len(result.mismatches_kept) == 16
    assert all(
        m.matches
        and m.expected is not None
        and m.seen is not None
        and m.expected - m.seen in (4.0, -192.0)
        for m in result.mismatches_kept
    )
    assert {a.arm for a in result.arms if a.mismatches} == set(ARMS)


@pytest.mark.parametrize(
    ("func", "timeout", "needles"),
    [
        ("hang", 8, ["still running after 8 s", "hangs"]),
        ("boom", 120, ["rank 1 failed", "injected reducer failure"]),
        ("quiet", 120, ["exited 0 without a readable result file"]),
    ],
)
def test_ranks_that_hang_raise_or_leave_no_result_are_one_named_line_exit_2(
    torch_python: str, tmp_path: Path, func: str, timeout: int, needles: list[str]
) -> None:
    started = time.monotonic()
    args = f"--timeout {timeout} --run-dir {tmp_path / 'run'}"
    done = canary(torch_python, func, args)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert all(needle in done.stderr for needle in needles), done.stderr
    assert time.monotonic() - started < timeout + 30  # the bound, the CLI's start, the kills
    assert not (tmp_path / "run").exists()


def test_sigterm_stops_the_ranks_and_removes_the_temp_dir(
    torch_python: str, tmp_path: Path
) -> None:
    psutil = pytest.importorskip("psutil")
    temp = tmp_path / "tmp"
    temp.mkdir()
    argv = ["-m", "miles_amd.cli", "canary", "--reducer", f"{REDUCERS}:hang", "--timeout", "300"]
    proc = subprocess.Popen(
        [torch_python, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    try:
        deadline = time.monotonic() + 120
        ranks: list = []
        while len(ranks) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
            ranks = psutil.Process(proc.pid).children(recursive=True)
        assert len(ranks) >= 4 and list(temp.iterdir()), "the ranks did not start"
        proc.send_signal(15)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, err
    assert "stopped by SIGTERM" in err and len(err.strip().splitlines()) == 1
    _, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive, alive
    assert list(temp.iterdir()) == []


def test_a_result_of_another_shape_is_a_mismatch_not_a_broadcast(torch_python: str) -> None:
    args = "--tokens 1,127 --detect-rate 0.5 --json"
    done = canary(torch_python, "first_row", args)
    assert done.returncode == 1, done.stderr
    assert "returned shape [1, 2880]" in done.stderr and "another fault" in done.stderr
    record = CanaryRecord.from_json(done.stdout)
    one, big = record.results
    assert one.mismatches == 0 and big.mismatches == big.calls  # N=1 has the right shape
    assert big.wrong_elements == 4 * big.calls * 127 * 2880  # every element of every rank


HIPIFY = """
import re, sys
from pathlib import Path
from torch.utils.hipify import hipify_python
from miles_amd.canary import worker

out = Path(sys.argv[1])
source = out / worker.KERNEL_SOURCE.name
source.write_text(worker.KERNEL_SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
hipify_python.hipify(project_directory=str(out), output_directory=str(out),
    includes=[str(out / "*")], is_pytorch_extension=True, show_progress=False)
print(re.sub(r"//[^\\n]*", "", source.with_suffix(".hip").read_text(encoding="utf-8")))
"""


def test_hipify_turns_the_positive_controls_kernel_into_hip(
    torch_python: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [torch_python, "-c", HIPIFY, str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert "hipIpcOpenMemHandle" in done.stdout and "hipLaunchKernelGGL" in done.stdout
    assert not re.search(r"\bcuda[A-Z]\w*", done.stdout)  # no CUDA runtime call left
