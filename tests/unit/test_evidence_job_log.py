"""The Ray job log: streamed as whole-line blocks with exact line numbers in bounded memory, and
its metric lines parsed safely (never evaluated). A log is the ``job.log`` of a run dir of its
own, read by ``load_run`` as the gate reads it: a metric line that cannot be read is a
``job_log`` problem naming its line."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_amd.evidence.job_log import CHUNK, MAX_LINE, line_blocks, parse_metric_dict
from miles_amd.evidence.load import load_run
from miles_amd.evidence.types import RunEvidence, SeriesMap, SourceProblem
from miles_amd.testing.miles_writer import ActorPids, metric_log_lines

PREFIX = "(MegatronTrainRayActor pid=4242) [2026-11-20 10:03:50.007 ] log_utils.py:542 - "
FAULT = "(MegatronTrainRayActor pid=1) Memory access fault by GPU node-9 on address 0x0."


def load_log(run: Path, lines: list[str], *, end: str = "\n", live: bool = False) -> RunEvidence:
    """``lines`` as the ``job.log`` of the run dir ``run``, read by ``load_run``."""
    run.mkdir()
    (run / "job.log").write_text("\n".join(lines) + end, encoding="utf-8")
    return load_run(run, live=live)


def log_series(run: Path, lines: list[str]) -> SeriesMap:
    evidence = load_log(run, lines)
    assert evidence.problems == (), evidence.problems
    return evidence.series


def log_problem(run: Path, lines: list[str], *, end: str = "\n") -> SourceProblem:
    (problem,) = load_log(run, lines, end=end).problems
    assert (problem.source, problem.path) == ("job_log", str(run / "job.log"))
    return problem


def blocks_of(data: bytes, *, live: bool = False) -> list[tuple[int, str]]:
    return list(line_blocks(io.BytesIO(data), len(data), live=live))


def test_blocks_hold_every_line_once_with_its_number_and_only_the_size_given() -> None:
    lines = [f"line {n} " + "x" * (n % 300) for n in range(1, 40_000)]
    data = ("\n".join(lines) + "\n").encode()
    blocks = blocks_of(data)
    assert len(data) > 3 * CHUNK and len(blocks) > 3
    assert "".join(text for _, text in blocks) == data.decode()
    assert all(text.endswith("\n") and text.startswith(f"line {n} ") for n, text in blocks)
    assert blocks_of(b"a\nb") == [(1, "a\n"), (2, "b")]
    assert blocks_of(b"a\nb", live=True) == [(1, "a\n")]  # the write in flight
    assert blocks_of(b"") == []
    assert list(line_blocks(io.BytesIO(b"one\ntwo\nthree\n"), 8)) == [(1, "one\ntwo\n")]


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


def test_a_long_progress_line_is_cut_after_a_carriage_return_and_max_line_is_whole() -> None:
    blocks = blocks_of(b"step 1%\r" * (MAX_LINE // 4) + b"Fatal Python error: x\n")
    assert all(text.endswith("\r") for _, text in blocks[:-1])  # no update split
    assert blocks[-1][1].endswith("Fatal Python error: x\n")
    assert {line for line, _ in blocks} == {1}
    data = b"\n" + b"z" * MAX_LINE + b"\nend\n"
    assert "".join(text for _, text in blocks_of(data)).split("\n")[1] == "z" * MAX_LINE


def test_metrics_and_sentinels_come_from_one_pass_with_their_line_numbers(tmp_path: Path) -> None:
    lines = [f"filler {n}" for n in range(50_000)]
    lines[1] = "q" * (3 * MAX_LINE)  # a huge line before them
    lines[30_000] = FAULT
    lines[40_000] = PREFIX + "step 7: {'train/loss': 1.5, 'train/grad_norm': 2}"
    assert log_series(tmp_path / "a", lines) == {
        "train/loss": ((7, 1.5),),
        "train/grad_norm": ((7, 2.0),),
    }
    hits = load_run(tmp_path / "a").sentinels
    assert [(hit.name, hit.first_line) for hit in hits] == [("hip_memory_access_fault", 30_001)]
    huge = "{" + ", ".join(f"'k{i}': {i}" for i in range(200_000)) + "}"  # over MAX_LINE
    problem = log_problem(tmp_path / "b", ["noise", PREFIX + f"step 3: {huge}", FAULT])
    assert problem.detail.startswith("line 2: ") and "truncated" in problem.detail
    assert [hit.first_line for hit in load_run(tmp_path / "b").sentinels] == [3]


@pytest.mark.timeout(300)
def test_reading_a_large_log_does_not_hold_it_in_memory(tmp_path: Path) -> None:
    """Peak RSS while ``load_run`` reads a 64 MiB log grows by a few MiB, not by the log (a
    child process of its own, so the peak is this read's)."""
    run = tmp_path / "run"
    run.mkdir()
    filler = "(SGLangEngine pid=77) [2026-05-28 10:00:00 TP0] Decode batch. #running-req: 64\n"
    chunk = filler * (CHUNK // len(filler))
    with open(run / "job.log", "w", encoding="utf-8") as log:
        for step in range(64):
            log.write(chunk + PREFIX + f"step {step}: {{'train/loss': 0.25}}\n")
    code = textwrap.dedent(
        f"""
        import resource
        from miles_amd.evidence.load import load_run
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        evidence = load_run({str(run)!r})
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert evidence.problems == () and len(evidence.series["train/loss"]) == 64
        print((after - before) * 1024)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) < 32 * 2**20, f"peak RSS grew {int(result.stdout) >> 20} MiB"


def test_reads_the_lines_miles_prints_ray_colours_numpy_reprs_and_non_finite(
    tmp_path: Path,
) -> None:
    lines = ["Starting Ray job", "(SGLangEngine pid=9) [2026-11-20 10:00:00 TP0] Decode batch."]
    for k in range(3):
        metrics = {
            "train/grad_norm": math.nan if k == 1 else 0.1,
            "perf/rollout_time": math.inf if k == 2 else 95.5 - k / 1000,
        }
        lines += metric_log_lines(k, metrics, ActorPids.around(1000), 1.78e9 + k)
    lines += [
        "\x1b[36m(MegatronTrainRayActor pid=4242)\x1b[0m [2026-11-20 10:03:50.007 ] "
        "log_utils.py:542 - step 0: {'train/loss': 0.5, 'train/step': 0} "
        "[repeated 2x across cluster]",
        PREFIX + "rollout 0: {'rollout/a': np.float64(0.25), 'rollout/b': np.float32(nan), "
        "'rollout/c': np.int64(-3), 'rollout/d': True, 'rollout/e': -inf, 'rollout/f': -'x', "
        "'rollout/g': +-2}",
        PREFIX + "perf 4: {'perf/t': 1.5, 'perf/name': 'x', 'perf/none': None, 'perf/l': [1, nan]}",
        PREFIX + "step 3: saving checkpoint",  # lines that are not metric lines
        PREFIX + "eval 3: {'eval/x': 1.0}",
        "step 3: {'train/loss': 1.0}",
        "print from a user: - step 3: {'train/loss': 1.0}",
    ]
    series = log_series(tmp_path / "run", lines)
    assert series["perf/rollout_time"] == ((0, 95.5), (1, 95.5 - 1 / 1000), (2, math.inf))
    assert series["train/step"] == ((0, 0.0), (1, 1.0), (2, 2.0))
    assert math.isnan(series["train/grad_norm"][1][1])
    assert series["train/loss"] == ((0, 0.5),) and series["perf/t"] == ((4, 1.5),)
    assert series["rollout/a"] == ((0, 0.25),) and math.isnan(series["rollout/b"][0][1])
    assert series["rollout/c"] == ((0, -3.0),) and series["rollout/d"] == ((0, 1.0),)
    assert series["rollout/e"] == ((0, -math.inf),) and series["rollout/g"] == ((0, -2.0),)
    assert not {"perf/name", "perf/none", "perf/l", "eval/x", "rollout/f"} & set(series)
    assert all(type(s) is int and type(v) is float for p in series.values() for s, v in p)


@pytest.mark.parametrize(
    ("dict_text", "reason"),
    [
        ("{'train/loss': 0.1, 'train/pg", "not a complete dict literal"),
        ("{'train/loss': __import__('os').system('touch PWNED')}", "is not a literal"),
        ("{'train/loss': tensor(0.5, device='cuda:0')}", "is not a literal"),
        ("{'train/loss': 1 + 2}", "is not a literal"),
        ("{'train/loss': 0.1, **extra}", "not a string literal"),
        ("{1: 0.5}", "not a string literal"),
        ("{'train/loss': [1, foo()]}", "is not a literal"),
        ("{'train/loss': {**x}}", "dict unpacking in a value"),
        ("{'train/loss': 10 ** 400}", "is not a literal"),
        ("{'train/loss': " + "9" * 400 + "}", "does not fit a float"),
        ("{'train/loss': " + "-" * 200_000 + "1}", "a run of 200000 sign characters"),
    ],
)
def test_unreadable_metric_lines_name_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dict_text: str, reason: str
) -> None:
    monkeypatch.chdir(tmp_path)
    lines = ["Ray job started", PREFIX + "step 0: {'train/loss': 0.2}", PREFIX + "step 1: "]
    problem = log_problem(tmp_path / "run", [*lines[:2], lines[2] + dict_text])
    assert problem.detail.startswith("line 3: unreadable metric line: ")
    assert reason in problem.detail
    assert not (tmp_path / "PWNED").exists()


def test_an_unterminated_last_line_is_the_write_in_flight_when_live(tmp_path: Path) -> None:
    lines = [PREFIX + "step 0: {'train/loss': 0.2}", PREFIX + "step 1: {'train/loss': 0.3, 'tr"]
    problem = log_problem(tmp_path / "done", lines, end="")
    assert problem.detail.startswith("line 2: ") and "not a complete dict literal" in problem.detail
    live = load_log(tmp_path / "live", lines, end="", live=True)
    assert (live.problems, live.series) == ((), {"train/loss": ((0, 0.2),)})


def test_a_value_printed_again_is_one_point_and_another_value_an_error(tmp_path: Path) -> None:
    """20,000 repeats of a line read as one point each (a repeat is checked against the
    step's first values only); a late change is caught naming both lines."""
    same = [PREFIX + "rollout 2: {'rollout/r': 0.5}", PREFIX + "perf 2: {'rollout/r': 0.5, 'p': 1}"]
    assert log_series(tmp_path / "a", same) == {"p": ((2, 1.0),), "rollout/r": ((2, 0.5),)}
    line = PREFIX + "step 3: {'train/x': nan, 'train/y': 1.0}"
    series = log_series(tmp_path / "b", [line] * 20_000)
    assert len(series["train/x"]) == 1 and series["train/y"] == ((3, 1.0),)
    changed = [line] * 20_000 + ["noise", PREFIX + "step 3: {'train/y': 2.0}"]
    problem = log_problem(tmp_path / "c", changed)
    assert problem.detail.startswith("line 20002: ")
    assert "'train/y' at step 3 is 2.0 here but 1.0 at line 1" in problem.detail


def fits_float(value: float | int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


keys = st.text(min_size=1, max_size=12)


@given(st.dictionaries(keys, st.floats() | st.integers(), max_size=8))
def test_any_number_dict_repr_reads_back_exactly(values: dict[str, float | int]) -> None:
    """Every reader path (regex, ast) reads what Python printed, bit for bit; an int no float
    can hold is an error, never inf."""
    if any(not fits_float(v) for v in values.values()):
        with pytest.raises(ValueError, match="does not fit a float"):
            parse_metric_dict(repr(values))
        return
    parsed = parse_metric_dict(repr(values))
    assert list(parsed) == list(values)
    for key, value in values.items():
        got, expected = parsed[key], float(value)
        assert type(got) is float
        assert (math.isnan(got) and math.isnan(expected)) or (
            got == expected and math.copysign(1, got) == math.copysign(1, expected)
        )


@given(st.dictionaries(keys, st.floats(width=32) | st.integers(-(2**40), 2**40), max_size=6))
def test_numpy_scalar_reprs_read_back(values: dict[str, float]) -> None:
    numpy_values = {
        key: np.float32(v) if isinstance(v, float) else np.int64(v) for key, v in values.items()
    }
    parsed = parse_metric_dict(repr(numpy_values))
    for key, value in numpy_values.items():
        expected = float(value)
        assert float(parsed[key]) == expected or (math.isnan(expected) and math.isnan(parsed[key]))
