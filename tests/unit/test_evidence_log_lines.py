"""The job log is streamed: whole-line blocks, exact line numbers, bounded memory."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from miles_amd.evidence.job_log import CHUNK, MAX_LINE, line_blocks
from miles_amd.evidence.load import load_run

METRIC = "(MegatronTrainRayActor pid=1) [2026-11-20 10:03:50.007 ] log_utils.py:542 - step {}: {}"
FAULT = "(MegatronTrainRayActor pid=1) Memory access fault by GPU node-9 on address 0x0."


def blocks_of(data: bytes, *, live: bool = False) -> list[tuple[int, str]]:
    return list(line_blocks(io.BytesIO(data), len(data), live=live))


def test_blocks_hold_every_line_once_with_its_number_across_chunks() -> None:
    lines = [f"line {n} " + "x" * (n % 300) for n in range(1, 40_000)]
    data = ("\n".join(lines) + "\n").encode()
    assert len(data) > 3 * CHUNK
    blocks = blocks_of(data)
    assert len(blocks) > 3
    assert "".join(text for _, text in blocks) == data.decode()
    for first, text in blocks:
        assert text.endswith("\n")
        assert text.startswith(f"line {first} ")


def test_an_unterminated_last_line_is_kept_unless_live() -> None:
    assert blocks_of(b"a\nb") == [(1, "a\n"), (2, "b")]
    assert blocks_of(b"a\nb", live=True) == [(1, "a\n")]
    assert blocks_of(b"", live=False) == []


def test_only_the_size_given_is_read() -> None:
    data = b"one\ntwo\nthree\n"
    assert list(line_blocks(io.BytesIO(data), 8)) == [(1, "one\ntwo\n")]


@pytest.mark.parametrize("length", [MAX_LINE + 1, 2 * MAX_LINE + 7, 5 * CHUNK])
@pytest.mark.parametrize("lead", [0, 10, CHUNK - 3])
def test_an_overlong_line_comes_in_pieces_and_the_numbering_goes_on(length: int, lead: int) -> None:
    data = b"a" * lead + b"\n" + b"y" * length + b"\nafter\n"
    blocks = blocks_of(data)
    assert all(len(text) <= MAX_LINE + CHUNK for _, text in blocks)  # bounded memory
    pieces = [text for line, text in blocks if "\n" not in text]  # of the unfinished line 2
    assert all(len(piece) <= MAX_LINE for piece in pieces)
    assert sum(text.count("y") for _, text in blocks) >= length  # nothing skipped
    ((first, text),) = [(line, text) for line, text in blocks if "after" in text]
    assert first + text[: text.index("after")].count("\n") == 3


def test_a_long_progress_line_is_cut_after_a_carriage_return() -> None:
    data = b"step 1%\r" * (MAX_LINE // 4) + b"Fatal Python error: x\n"
    blocks = blocks_of(data)
    assert all(text.endswith("\r") for _, text in blocks[:-1])  # no update split
    assert blocks[-1][1].endswith("Fatal Python error: x\n")
    assert {line for line, _ in blocks} == {1}


def test_a_line_of_exactly_max_line_bytes_is_whole() -> None:
    data = b"\n" + b"z" * MAX_LINE + b"\nend\n"
    assert "".join(text for _, text in blocks_of(data)).split("\n")[1] == "z" * MAX_LINE


def test_metric_lines_and_sentinels_after_a_huge_line_keep_their_line_numbers(
    tmp_path: Path,
) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "noise\n"
        + "q" * (3 * MAX_LINE)
        + "\n"
        + METRIC.format(0, "{'train/loss': 0.5}")
        + "\n"
        + FAULT
        + "\n",
        encoding="utf-8",
    )
    evidence = load_run(tmp_path)
    assert (evidence.problems, evidence.series) == ((), {"train/loss": ((0, 0.5),)})
    (hit,) = evidence.sentinels
    assert hit.first_line == 4


def test_an_overlong_metric_line_is_an_error_naming_its_line(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    huge = "{" + ", ".join(f"'k{i}': {i}" for i in range(200_000)) + "}"
    log.write_text("noise\n" + METRIC.format(3, huge) + "\n", encoding="utf-8")
    (problem,) = load_run(tmp_path).problems
    assert problem.source == "job_log" and problem.detail.startswith("line 2: ")
    assert "truncated" in problem.detail


def test_load_run_reads_metrics_and_sentinels_in_one_pass(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lines = [f"filler {n}" for n in range(50_000)]
    lines[30_000] = FAULT
    lines[40_000] = METRIC.format(7, "{'train/loss': 1.5, 'train/grad_norm': 2}")
    (run / "job.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    evidence = load_run(run)
    assert evidence.problems == ()
    assert evidence.series == {"train/loss": ((7, 1.5),), "train/grad_norm": ((7, 2.0),)}
    assert [(hit.name, hit.first_line) for hit in evidence.sentinels] == [
        ("hip_memory_access_fault", 30_001)
    ]


@pytest.mark.timeout(300)
def test_reading_a_large_log_does_not_hold_it_in_memory(tmp_path: Path) -> None:
    """Peak RSS while ``load_run`` reads a 192 MiB log grows by a few MiB, not by the log."""
    run = tmp_path / "run"
    run.mkdir()
    filler = (
        "(SGLangEngine pid=77) [2026-05-28 10:00:00 TP0] Decode batch. #running-req: 64, "
        "#token: 40960, gen throughput (token/s): 1234.50, #queue-req: 0\n"
    )
    chunk = filler * (CHUNK // len(filler))
    with open(run / "job.log", "w", encoding="utf-8") as log:
        for step in range(192):
            log.write(chunk)
            log.write(METRIC.format(step, "{'train/loss': 0.25}") + "\n")
    size = (run / "job.log").stat().st_size
    code = textwrap.dedent(
        f"""
        import resource, sys
        from miles_amd.evidence.load import load_run
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        evidence = load_run({str(run)!r})
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert evidence.problems == () and len(evidence.series["train/loss"]) == 192
        print((after - before) * 1024)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=280, check=False
    )
    assert result.returncode == 0, result.stderr
    grown = int(result.stdout)
    assert grown < 32 * 2**20, f"peak RSS grew {grown / 2**20:.0f} MiB reading {size >> 20} MiB"
