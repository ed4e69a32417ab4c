"""The canary's CPU harness for real: ``miles-amd canary --reducer`` in 4 gloo processes.

Each test runs ``python -m miles_amd.cli canary`` as a process of an interpreter that has
torch (this one, else ``$MILES_AMD_MILES_PYTHON``, the conformance env's, which ``.ci/run``
installs the project into); without one the tests skip saying how to get torch, unless
``MILES_AMD_REQUIRE_TORCH=1`` (``.ci/run`` sets it), when they fail. The reducers are small
files written here: gloo's own all-reduce (clean), one built like the suspect bug class
(stale data in the tail of the result, with a set probability per call, at the suspect
sizes only), one that hangs and one that raises. The detection power is measured over
repeats, not taken from the formula. Budget: the four launches take about 50 CPU-seconds on
2 cores (4 ranks import torch each time).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import jsonschema
import pytest

from miles_amd.canary.record import schema_path
from miles_amd.records.canary import CanaryRecord
from tests.support.fake_aiter import fake_aiter

pytestmark = pytest.mark.no_ray  # starts no Ray: joins no Ray xdist group

GLOO = """
import torch.distributed as dist


def gloo(tensor, group):
    dist.all_reduce(tensor, group=group)
    return tensor
"""

# Built like the bug class: at the suspect sizes, with probability RATE per call, one rank's
# result keeps stale data (its own unreduced input) in the elements past the last whole tile.
# Every rank draws from the same seeded stream, so all agree on which calls are hit.
STALE = """
import os
import random

import torch.distributed as dist

from miles_amd.canary.dispatch import dispatch

RATE = float(os.environ["CANARY_TEST_RATE"])
TAIL = 37
_draws = random.Random(int(os.environ["CANARY_TEST_SEED"]))


def stale(tensor, group):
    world = dist.get_world_size(group)
    before = tensor.clone()
    dist.all_reduce(tensor, group=group)
    hit = _draws.random() < RATE
    victim = _draws.randrange(world)
    suspect = dispatch(tensor.shape[0] * 2880 * 2, world, 2).affected
    if hit and suspect and dist.get_rank(group) == victim:
        tensor.view(-1)[-TAIL:].copy_(before.view(-1)[-TAIL:])
    return tensor
"""

HANG = """
import time


def hang(tensor, group):
    time.sleep(3600)
"""

RAISE = """
import torch.distributed as dist


def boom(tensor, group):
    if dist.get_rank(group) == 1:
        raise RuntimeError("injected reducer failure")
    dist.all_reduce(tensor, group=group)
    return tensor
"""


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


def canary(
    python: str,
    tmp_path: Path,
    source: str,
    func: str,
    *args: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    reducer = tmp_path / f"{func}.py"
    reducer.write_text(source, encoding="utf-8")
    return subprocess.run(
        [
            python,
            "-m",
            "miles_amd.cli",
            "canary",
            "--reducer",
            f"{reducer}:{func}",
            "--world-size",
            "4",
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def test_gloo_all_reduce_is_clean_and_the_record_is_valid(
    torch_python: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    done = canary(
        torch_python,
        tmp_path,
        GLOO,
        "gloo",
        "--detect-rate",
        "0.02",
        "--json",
        "--run-dir",
        str(run_dir),
    )
    assert done.returncode == 0, done.stderr
    text = (run_dir / "canary.json").read_text(encoding="utf-8")
    assert json.loads(done.stdout) == json.loads(text)
    jsonschema.validate(json.loads(text), json.loads(schema_path().read_text(encoding="utf-8")))
    record = CanaryRecord.from_json(text)
    assert record.clean and record.implementation == "reducer" and record.backend == "gloo"
    assert [r.tokens for r in record.results] == [e["tokens"] for e in record.plan]
    assert all(
        r.calls >= e["calls"] and r.latency_us
        for r, e in zip(record.results, record.plan, strict=True)
    )
    assert record.power.affected_calls >= 228 and record.power.probability >= 0.99
    assert {r.kernel for r in record.results} == {"1stage", "2stage"}


def binomial_lower_bound(successes: int, trials: int, confidence: float) -> float:
    """One-sided Clopper-Pearson lower bound: the p with P(X >= successes | p) = 1 - confidence."""

    def tail(p: float) -> float:
        return sum(
            math.comb(trials, k) * p**k * (1 - p) ** (trials - k)
            for k in range(successes, trials + 1)
        )

    low, high = 0.0, successes / trials
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if tail(mid) < 1 - confidence else (low, mid)
    return low


def test_a_stale_tail_at_the_stated_rate_is_caught_at_the_stated_power(
    torch_python: str, tmp_path: Path
) -> None:
    """Per-call rate 0.5 at N=29 (2-stage, non-uniform) and a budget for 0.5 at 99 %: 7 calls a
    repeat. Over 100 repeats the detection fraction is measured; a harness that missed the
    corruption, or looked at too few elements, would show it."""
    repeats = 100
    done = canary(
        torch_python,
        tmp_path,
        STALE,
        "stale",
        "--tokens",
        "29",
        "--detect-rate",
        "0.5",
        "--repeats",
        str(repeats),
        "--json",
        env={"CANARY_TEST_RATE": "0.5", "CANARY_TEST_SEED": "20261202"},
    )
    assert done.returncode == 1, done.stderr
    assert "N=29 (2stage, suspect class)" in done.stderr
    record = CanaryRecord.from_json(done.stdout)
    (result,) = record.results
    assert result.calls == 7 * repeats and record.power.affected_calls == 7
    detected = record.repeats_with_mismatch
    assert binomial_lower_bound(detected, repeats, 0.95) >= 0.9, detected
    assert repeats - detected <= 4, detected  # P(>= 5 misses | power 0.99) = 0.34 %
    assert 0.35 * result.calls <= result.mismatches <= 0.65 * result.calls
    first = result.first_mismatch
    assert first is not None and first.index >= 29 * 2880 - 37 and first.expected != first.seen


def test_a_reducer_that_hangs_is_a_named_exit_2_within_the_timeout(
    torch_python: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    done = canary(
        torch_python, tmp_path, HANG, "hang", "--timeout", "8", "--run-dir", str(tmp_path / "run")
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    assert "still running after 8 s" in done.stderr and "hangs" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert elapsed < 8 + 30  # the bound, plus the CLI's own start and the kills
    assert not (tmp_path / "run").exists()


def test_a_reducer_that_raises_is_a_named_exit_2(torch_python: str, tmp_path: Path) -> None:
    done = canary(
        torch_python,
        tmp_path,
        RAISE,
        "boom",
        "--timeout",
        "120",
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert done.returncode == 2, done.stderr
    assert "rank 1 failed" in done.stderr and "injected reducer failure" in done.stderr
    assert not (tmp_path / "run").exists()


SEES_AITER = (
    GLOO
    + """

def sees_aiter(tensor, group):
    import importlib.util

    if importlib.util.find_spec("aiter") is None:  # found, never imported (it raises)
        raise RuntimeError("this rank does not see the aiter the canary fingerprinted")
    return gloo(tensor, group)
"""
)


def test_the_canary_its_ranks_and_its_record_see_the_aiter_the_rule_chooses(
    torch_python: str, tmp_path: Path
) -> None:
    """``--variant patched`` with AITER_PATCHED_DIR: the fingerprint, the constants and every
    rank see the patched checkout (it is on no PYTHONPATH of the command's own)."""
    entry, header = fake_aiter(tmp_path / "aiter", fixed=True, layout="checkout")
    run_dir = tmp_path / "run"
    done = canary(
        torch_python, tmp_path, SEES_AITER, "sees_aiter",
        "--variant", "patched", "--tokens", "29,64", "--detect-rate", "0.2",
        "--run-dir", str(run_dir),
        env={"AITER_PATCHED_DIR": str(entry), "PYTHONPATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = CanaryRecord.from_json((run_dir / "canary.json").read_text(encoding="utf-8"))
    assert record.aiter_fix is not None and record.aiter_fix.startswith(f"fixed: {header} sha256:")
    assert record.dispatch_source.startswith(f"installed {header}, ")
