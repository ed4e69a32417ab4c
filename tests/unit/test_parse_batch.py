"""The conformance tier's parse batch (``tests/conformance/child.py batch`` through
``harness.parse_batch`` / ``parse_all``), on a stand-in ``miles`` package in a tmp dir.

The real miles is parsed this way in the conformance tier (and checked there against a fresh
interpreter); these tests drive the paths the real one never takes on a good day, each in
real subprocesses and forks of this Python: a key the import asks for sends the job that
sets it back to a fresh interpreter; argparse's exit and a validator's refusal read as in a
fresh parse; a fork that does not exit in time is sent back too (a wedged parse then times
out in the fresh one); an import that fails leaves every job to a fresh interpreter, whose
outcome names the failure.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conformance import harness
from tests.conformance.harness import MilesCheckout
from tests.unit.test_parse_probe import stand_in_miles

# A stand-in for miles.utils.arguments: asks for AT_IMPORT while it is imported (as Ray's
# worker asks for CUDA_VISIBLE_DEVICES), reads PARSE_ENV inside parse_args (as miles reads
# MILES_CI_GATE_RECORD_DIR), refuses --refuse like a validator, --no-such like argparse.
ARGUMENTS = """
import argparse, os, time
SEEN_AT_IMPORT = os.environ.get("AT_IMPORT")

def parse_args():
    parser = argparse.ArgumentParser(prog="train.py")
    parser.add_argument("--num-rollout", type=int, default=1)
    parser.add_argument("--refuse", action="store_true")
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    if args.refuse:
        raise ValueError("refused by the validator")
    while args.hang:
        time.sleep(1)
    args.parse_env = os.environ.get("PARSE_ENV")
    args.seen_at_import = SEEN_AT_IMPORT
    return args
"""


def stand_in(root: Path, arguments: str = ARGUMENTS) -> MilesCheckout:
    stand_in_miles(root, arguments)
    # miles_parse's GPU stubs ask torch whether it sees a GPU: a torch that sees none.
    (root / "torch.py").write_text("class cuda:\n    is_available = staticmethod(lambda: False)\n")
    return MilesCheckout(root / "miles", root, Path(sys.executable), False)


def job(root: Path, *argv: str, **env: str) -> harness.Job:
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": str(root)}
    return harness.Job({}, list(argv), {**base, **env})


def test_the_batch_forks_what_it_can_and_sends_back_what_the_import_read(tmp_path) -> None:
    checkout = stand_in(tmp_path)
    jobs = {
        "plain": job(tmp_path, "--num-rollout", "3", PARSE_ENV="a"),
        "other": job(tmp_path, PARSE_ENV="b"),
        "import-read": job(tmp_path, AT_IMPORT="set"),
        "argparse": job(tmp_path, "--no-such"),
        "validator": job(tmp_path, "--refuse"),
    }
    run = harness.parse_all(checkout, jobs)
    assert set(run.forked) == {"plain", "other", "argparse", "validator"}
    assert run.forked["plain"] == {"PARSE_ENV"}
    assert run.sent_back == {"import-read": "the import asked for AT_IMPORT"}
    plain, other = run.outcomes["plain"].args or {}, run.outcomes["other"].args or {}
    assert (plain["num_rollout"], plain["parse_env"], other["parse_env"]) == (3, "a", "b")
    # parsed in a fresh interpreter, so the import saw the key
    assert (run.outcomes["import-read"].args or {})["seen_at_import"] == "set"
    assert run.outcomes["argparse"].returncode == 2
    assert run.outcomes["argparse"].message == "unrecognized arguments: --no-such"
    assert run.outcomes["validator"].returncode == 1
    assert run.outcomes["validator"].message == "ValueError: refused by the validator"


def test_a_wedged_fork_is_sent_back_and_the_fresh_parse_times_out(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(harness, "FORK_TIMEOUT_S", 1.0)
    checkout = stand_in(tmp_path)
    jobs = {"hang": job(tmp_path, "--hang"), "ok": job(tmp_path)}
    batch = harness.parse_batch(checkout, jobs)
    assert batch is not None
    assert batch.sent_back == {"hang": "no exit within 1 s of the fork"}
    assert batch.outcomes["ok"].ok
    hang = harness.parse_with_miles(["--hang"], jobs["hang"].env, python=sys.executable, timeout=1)
    assert hang.returncode is None
    assert hang.message == "the parse did not finish within 1 s"


@pytest.mark.parametrize("broken", ["raise ImportError('no torch here')", "import no_such_mod"])
def test_a_failed_import_leaves_every_job_to_a_fresh_parse(tmp_path, broken) -> None:
    checkout = stand_in(tmp_path, f"{broken}\n{ARGUMENTS}")
    jobs = {"a": job(tmp_path), "b": job(tmp_path, PARSE_ENV="x")}
    assert harness.parse_batch(checkout, jobs) is None
    run = harness.parse_all(checkout, jobs)
    assert run.forked == {}
    for outcome in run.outcomes.values():
        assert outcome.returncode == 1 and "Error" in outcome.message, outcome
