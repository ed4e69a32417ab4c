"""The embedded example run: rebuilt byte for byte by its script, and it says what it is."""

from __future__ import annotations

import filecmp
import json
import subprocess
import sys
from pathlib import Path

from miles_amd.evidence.ci_history import read_ci_history_dir
from miles_amd.evidence.load import load_run
from miles_amd.evidence.tensorboard import read_tensorboard_dir
from tests.constants import CLIPFRAC, EXAMPLE, LOGPROB, PUBLISHED_REWARD, REPO, REWARD, SHIPPED

SCRIPT = REPO / "examples" / "make_jvvnhop9.py"


def committed_files(root: Path) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and "report" not in p.relative_to(root).parts
    )


def test_the_script_rebuilds_the_committed_example_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "jvvnhop9"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "TZ": "Asia/Tokyo"},  # a foreign zone changes nothing
    )
    assert result.returncode == 0, result.stderr
    assert committed_files(out) == committed_files(EXAMPLE)
    names = committed_files(EXAMPLE)
    match, mismatch, errors = filecmp.cmpfiles(out, EXAMPLE, names, shallow=False)
    assert (mismatch, errors) == ([], [])
    assert len(match) == 8  # README, job.json, job.log, 2 CI records, 3 event files


def test_every_source_carries_the_published_series(tmp_path: Path) -> None:
    expected_rewards = [round(v * 64) / 64 for v in PUBLISHED_REWARD]
    for v, k64 in zip(PUBLISHED_REWARD, expected_rewards, strict=True):
        assert abs(v - k64) <= 5e-5  # the published rounding of k/64
    patched = json.loads((SHIPPED / "patched.json").read_text())
    published_logprob = patched["evidence"]["series"][LOGPROB]
    tensorboard = read_tensorboard_dir(EXAMPLE / "tensorboard")
    ci_history = read_ci_history_dir(EXAMPLE / "ci_history")
    (tmp_path / "job.log").write_bytes((EXAMPLE / "job.log").read_bytes())
    log_only = load_run(tmp_path)  # the job log alone: its own series, not the merged ones
    assert log_only.problems == ()
    job_log = log_only.series
    for source in (tensorboard, ci_history, job_log):
        assert [v for _, v in source[REWARD]] == expected_rewards
        assert [s for s, _ in source[REWARD]] == list(range(20))
        assert [s for s, _ in source[LOGPROB]] == list(range(20))
        for (_, value), published in zip(source[LOGPROB], published_logprob, strict=True):
            assert abs(value - published) <= 1e-7 * published  # float32 in TensorBoard
    for source in (tensorboard, job_log):
        assert source[CLIPFRAC] == tuple((i, 0.0) for i in range(20))
    assert CLIPFRAC not in ci_history  # miles' CI history does not capture it
    for source in (tensorboard, ci_history, job_log):
        for absent in ("train/train_rollout_kl", "rollout/response_len/mean", "train/grad_norm"):
            assert absent not in source


def test_the_example_reads_cleanly_as_a_succeeded_run() -> None:
    evidence = load_run(EXAMPLE)
    assert evidence.problems == () and evidence.conflicts == () and evidence.sentinels == ()
    assert evidence.job is not None and evidence.job.status == "SUCCEEDED"
    assert evidence.job.end_time - evidence.job.start_time == 66 * 60
