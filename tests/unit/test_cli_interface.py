"""The CI interface is exact: exit codes are the verdict, and no command has a side effect
nobody asked for.

In-process through typer's ``CliRunner`` (``miles_amd.cli.main.app``), except the closed-pipe
checks, which need a real pipe and so a real ``miles-amd`` process: its stdout (and, once,
its stderr) is a pipe whose reading end is closed before the process starts, so its first
write fails with EPIPE, as under ``| head -0``, and the exit code must still be the
command's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner, Result

from miles_amd.cli.main import app
from miles_amd.exit_codes import EXIT_CODES_HELP
from miles_amd.history.store import HistoryStore
from miles_amd.run_dir import RunDir
from tests.constants import LOGPROB
from tests.run_dirs import published_values, write_run


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def one_error_line(result: Result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("miles-amd: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A passing and a failing run dir, a compare pair, a history, a not-a-run dir, a file."""
    root = tmp_path_factory.mktemp("runs")
    good = published_values()
    spiked = {**good, LOGPROB: [*good[LOGPROB][:-1], 0.9]}
    history = root / "history.sqlite"
    with HistoryStore(history):
        pass
    (root / "plain").mkdir()
    (root / "plain" / "notes.txt").write_text("not a run\n")
    (root / "a-file").write_text("x\n")
    return {
        "pass": write_run(root / "pass", good),
        "fail": write_run(root / "fail", spiked),
        "history": history,
        "plain": root / "plain",
        "file": root / "a-file",
        "out": root / "out",
    }


def gate(run_dir: Path) -> list[str]:
    return ["gate", "--run-dir", str(run_dir), "--baseline", "patched"]


def record(run_dir: Path) -> list[str]:
    return ["baseline", "record", "--run-dir", str(run_dir)]


def compare(a: Path, b: Path) -> list[str]:
    return ["compare", "--run-dir", str(a), "--run-dir", str(b)]


def closed_pipe_cases(runs: dict[str, Path]) -> dict[str, tuple[list[str], int]]:
    """Every command, with the exit code it owes whatever happens to its output."""
    out = runs["out"]
    return {
        "help": (["--help"], 0),
        "version": (["--version"], 0),
        "prepare": (["prepare", "--dry-run"], 0),
        "prepare-bad": (["prepare", "--json"], 2),
        "train": (["train", "--dry-run", "--json"], 0),
        "full-train": (["full-train", "--dry-run"], 0),
        "preflight-bad": (["preflight", "--run-dir", str(runs["file"])], 2),
        "gate-pass": ([*gate(runs["pass"]), "--report-dir", str(out / "gp"), "--no-history"], 0),
        "gate-fail": (
            [*gate(runs["fail"]), "--report-dir", str(out / "gf"), "--no-history", "--format=json"],
            1,
        ),
        "gate-bad": (gate(runs["plain"]), 2),
        "baseline-diff": (["baseline", "diff", "stock", "patched"], 1),  # they differ
        "baseline-record-bad": (
            [*record(runs["plain"]), "--variant", "patched", "--out", str(out / "b.json")],
            2,
        ),
        "compare": (
            [*compare(runs["pass"], runs["fail"]), "--out-dir", str(out / "cmp")],
            0,
        ),
        "history": (["history", "--history", str(runs["history"])], 0),
    }


CASE_NAMES = [
    "help", "version", "prepare", "prepare-bad", "train", "full-train", "preflight-bad",
    "gate-pass", "gate-fail", "gate-bad", "baseline-diff", "baseline-record-bad", "compare",
    "history",
]  # fmt: skip


@pytest.mark.parametrize("case", CASE_NAMES)
def test_a_closed_stdout_changes_no_exit_code(runs: dict[str, Path], case: str) -> None:
    argv, code = closed_pipe_cases(runs)[case]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        result = subprocess.run(
            [sys.executable, "-m", "miles_amd.cli", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr


# The commands that write to stderr (a failing verdict, a usage or input error); a passing
# gate writes only to stdout, which the test above closes.
@pytest.mark.parametrize("case", ["gate-fail", "gate-bad", "prepare-bad"])
def test_closed_stdout_and_stderr_change_no_exit_code(runs: dict[str, Path], case: str) -> None:
    argv, code = closed_pipe_cases(runs)[case]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "miles_amd.cli", *argv],
            stdout=write_end,
            stderr=write_end,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.returncode == code


def test_every_commands_help_lists_the_exit_codes() -> None:
    group = typer.main.get_command(app)  # typer's own click: groups have `commands`
    paths: list[list[str]] = [[]]
    for name, command in getattr(group, "commands", {}).items():
        if hasattr(command, "commands"):
            paths += [[name, sub] for sub in command.commands]
        else:
            paths.append([name])
    assert len(paths) >= 10  # root, prepare, train, full-train, preflight, gate, 2 baseline, ...
    for path in paths:
        result = invoke(*path, "--help")
        assert result.exit_code == 0, path
        assert " ".join(EXIT_CODES_HELP.split()) in " ".join(result.stdout.split()), path


@pytest.mark.parametrize("command", ["prepare", "train", "full-train"])
def test_json_without_dry_run_is_refused(tmp_path: Path, command: str) -> None:
    result = invoke(command, "--json", "--run-dir", str(tmp_path / "r"))
    if command == "prepare":
        result = invoke(command, "--json")
    one_error_line(result, "--json", "--dry-run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["gate", "compare", "baseline record"])
@pytest.mark.parametrize("kind", ["plain", "file", "missing"])
def test_a_dir_that_is_no_run_dir_is_one_line_and_nothing_written(
    runs: dict[str, Path], tmp_path: Path, command: str, kind: str
) -> None:
    target = runs[kind] if kind != "missing" else tmp_path / "missing"
    before = tree(target) if target.is_dir() else None
    args = {
        "gate": gate(target),
        "compare": compare(runs["pass"], target),
        "baseline record": [
            *record(target),
            "--variant",
            "patched",
            "--out",
            str(tmp_path / "b.json"),
        ],
    }[command]
    result = invoke(*args)
    expected = {"plain": "not a run directory", "file": "is a file", "missing": "no such"}
    one_error_line(result, f"--run-dir {target}", expected[kind])
    if before is not None:
        assert tree(target) == before
    assert not target.exists() or target.is_dir() or kind == "file"
    assert not (tmp_path / "b.json").exists()
    assert not RunDir(runs["pass"]).compare_report.exists()


@pytest.mark.parametrize("command", ["train", "full-train", "preflight"])
def test_a_run_dir_that_is_a_file_is_refused(runs: dict[str, Path], command: str) -> None:
    extra = ["--dry-run"] if command != "preflight" else []
    result = invoke(command, *extra, "--run-dir", str(runs["file"]))
    one_error_line(result, f"--run-dir {runs['file']}", "is a file")
    assert runs["file"].read_text() == "x\n"


def test_gate_appends_only_to_a_named_history(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("MILES_AMD_HISTORY", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    args = [*gate(runs["pass"]), "--report-dir"]
    unnamed = invoke(*args, str(tmp_path / "r1"))
    assert unnamed.exit_code == 0, unnamed.output
    assert "history:" not in unnamed.output
    assert not (home / "data").exists() and not (home / ".local").exists()
    assert [p for p in home.rglob("*") if p.suffix == ".sqlite"] == []  # (matplotlib caches)
    named = tmp_path / "h.sqlite"
    result = invoke(*args, str(tmp_path / "r2"), "--history", str(named))
    assert result.exit_code == 0, result.output
    assert f"history: appended as run 1 to {named}" in result.stdout
    monkeypatch.setenv("MILES_AMD_HISTORY", str(named))
    from_env = invoke(*args, str(tmp_path / "r3"))
    assert f"history: appended as run 2 to {named}" in from_env.stdout
    ignored = invoke(*args, str(tmp_path / "r4"), "--no-history")
    assert ignored.exit_code == 0 and "history:" not in ignored.output
    with HistoryStore(named, read_only=True) as store:
        assert [r.verdict for r in store.runs()] == ["pass", "pass"]


def test_history_never_creates_or_modifies_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MILES_AMD_HISTORY", raising=False)
    one_error_line(invoke("history"), "--history", "MILES_AMD_HISTORY")
    missing = tmp_path / "sub" / "none.sqlite"
    one_error_line(invoke("history", "--history", str(missing)), f"--history {missing}")
    assert not missing.parent.exists()
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    one_error_line(invoke("history", "--history", str(empty)), "not a miles-amd history")
    assert empty.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == [
        "empty.sqlite"
    ]


def test_history_lists_read_only(runs: dict[str, Path], tmp_path: Path) -> None:
    history = tmp_path / "h.sqlite"
    gate = ["gate", "--run-dir", str(runs["pass"]), "--baseline", "patched"]
    assert (
        invoke(*gate, "--report-dir", str(tmp_path / "r"), "--history", str(history)).exit_code == 0
    )
    before = history.read_bytes()
    listed = invoke("history", "--history", str(history), "--format", "json")
    assert listed.exit_code == 0, listed.output
    assert [r["verdict"] for r in json.loads(listed.stdout)["runs"]] == ["pass"]
    assert history.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite", "r"]


def test_an_unknown_variant_is_refused(runs: dict[str, Path]) -> None:
    result = invoke("history", "--history", str(runs["history"]), "--variant", "bogus")
    assert result.exit_code == 2
    assert "bogus" in result.output and "stock" in result.output


def test_num_rollouts_is_the_gates_flag_and_the_old_spelling_still_parses(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    for flag in ("--num-rollouts", "--expected-rollouts"):
        result = invoke(
            *gate(runs["pass"]), "--no-history", "--report-dir", str(tmp_path / flag), flag, "19"
        )
        assert result.exit_code == 1, result.output  # 20 rollouts where 19 are expected
        report = json.loads((tmp_path / flag / "report.json").read_text())
        assert report["expected_rollouts"] == 19
    help_text = invoke("gate", "--help").stdout
    assert "--num-rollouts <int>" in help_text and "--expected-rollouts" not in help_text


def test_help_placeholders_name_the_type() -> None:
    train = " ".join(invoke("train", "--help").stdout.split())
    for placeholder in (
        "--gate <stock|patched|path>",
        "--hardware <MI355X|MI350X|auto>",
        "--num-rollouts <int>",
        "--run-dir <path>",
        "--history <path>",
        "--timeout <seconds>",
    ):
        assert placeholder in train, placeholder
    assert "<str>" not in train and "<int range>" not in train
    gate = " ".join(invoke("gate", "--help").stdout.split())
    assert (
        "--baseline <auto|stock|patched|path>" in gate and "--format <text|json|markdown>" in gate
    )
    record = " ".join(invoke("baseline", "record", "--help").stdout.split())
    assert "--variant <stock|patched>" in record and "<str>" not in record


def test_no_proxy_has_no_duplicate_entry() -> None:
    from miles_amd.recipe.plan import job_env_vars
    from miles_amd.recipe.settings import Recipe

    assert job_env_vars(Recipe(), {}, "127.0.0.1", None)["no_proxy"] == "127.0.0.1"
    assert job_env_vars(Recipe(), {}, "10.0.0.5", None)["no_proxy"] == "127.0.0.1,10.0.0.5"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--aiter-variant", "foo"), ("'--aiter-variant'", "'foo' is not one of", "'rccl'")),
        (("--num-rollouts", "abc"), ("'--num-rollouts'", "valid integer")),
    ],
)
def test_a_bad_value_is_one_line_without_the_converters_prefix(
    args: tuple[str, ...], needles: tuple[str, ...]
) -> None:
    from tests.cli_runs import run_cli

    result = run_cli("train", "--dry-run", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("miles-amd: error: Invalid value for")
    assert "Value error" not in lines[0] and ".;" not in lines[0], lines[0]
    assert lines[0].endswith("; see `miles-amd train --help`"), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
