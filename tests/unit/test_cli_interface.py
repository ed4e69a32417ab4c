"""The CI interface is exact: exit codes are the verdict, and no command has a side effect
nobody asked for. In-process, except where the process is the subject: a closed pipe (its
reading end closed before the process starts), Ctrl-C (a real SIGINT), the console script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import typer

from miles_amd.cli.main import app
from miles_amd.exit_codes import EXIT_CODES_HELP
from miles_amd.history.store import HistoryStore
from tests.cli_runs import one_error_line, run_cli
from tests.run_dirs import published_values, write_run


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A passing run dir, a history, a dir that is no run dir, a file."""
    root = tmp_path_factory.mktemp("runs")
    with HistoryStore(root / "history.sqlite"):
        pass
    (root / "plain").mkdir()
    (root / "plain" / "notes.txt").write_text("not a run\n")
    (root / "a-file").write_text("x\n")
    run = write_run(root / "pass", published_values())
    return {"pass": run, "history": root / "history.sqlite", "plain": root / "plain",
            "file": root / "a-file"}  # fmt: skip


def gate(run_dir: Path, *more: str) -> list[str]:
    return ["gate", "--run-dir", str(run_dir), "--baseline", "patched", *more]


# (argv, exit code, stderr closed too): click's help, a document and exit 1, a usage error
CLOSED_PIPE = {
    "help": (["--help"], 0, False),
    "diff": (["baseline", "diff", "stock", "patched"], 1, True),
    "usage": (["prepare", "--json"], 2, True),
}


@pytest.mark.parametrize("case", sorted(CLOSED_PIPE))
def test_a_closed_stdout_or_stderr_changes_no_exit_code(case: str) -> None:
    argv, code, both = CLOSED_PIPE[case]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "miles_amd.cli", *argv],
            stdout=write_end,
            stderr=write_end if both else subprocess.PIPE,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == code, done.stderr
    if not both:
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_the_console_script_and_ctrl_c(tmp_path: Path) -> None:
    """The installed ``miles-amd`` script; a real SIGINT is one line naming the command."""
    script = Path(sys.executable).parent / "miles-amd"
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == f"miles-amd {version('miles-amd')}\n"
    code = (
        "import os, signal, threading\n"
        "from miles_amd.cli.main import main\n"
        "threading.Timer(0.4, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        f"main(['gate', '--example', '--baseline', 'patched', '--report-dir', {str(tmp_path)!r}])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 130, done.stderr
    assert done.stderr == "miles-amd gate: interrupted (Ctrl-C); exit 130\n"


def test_shell_completion_is_on() -> None:
    env = {**os.environ, "_MILES_AMD_COMPLETE": "complete_bash", "COMP_WORDS": "miles-amd ga"}
    done = run_cli(env={**env, "COMP_CWORD": "1"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gate"]
    assert "--install-completion" in run_cli("--help").stdout


def test_every_help_lists_the_exit_codes_and_names_each_placeholders_type() -> None:
    group = typer.main.get_command(app)  # typer's own click: groups have `commands`
    paths: list[list[str]] = [[]]
    for name, command in getattr(group, "commands", {}).items():
        subcommands = getattr(command, "commands", None)
        paths += [[name, sub] for sub in subcommands] if subcommands else [[name]]
    assert len(paths) >= 12  # root, 4 train-like, gate, compare, canary, 2 baseline, history
    helps = {}
    for path in paths:
        done = run_cli(*path, "--help")
        assert done.returncode == 0, path
        helps[" ".join(path)] = text = " ".join(done.stdout.split())
        assert " ".join(EXIT_CODES_HELP.split()) in text, path
        assert "<bool>" not in text, path
    for command, placeholders in {
        "train": (
            "--gate <stock|patched|path>", "--hardware <MI355X|MI350X|auto>",
            "--num-rollouts <int>", "--run-dir <path>", "--history <path>",
            "--timeout <seconds>",
        ),
        "gate": ("--baseline <auto|stock|patched|path>", "--format <text|json|markdown>"),
        "baseline record": ("--variant <stock|patched>",),
    }.items():  # fmt: skip
        for placeholder in placeholders:
            assert placeholder in helps[command], (command, placeholder)
        assert "<str>" not in helps[command] and "<int range>" not in helps[command]
    # the hidden old spellings parse (test_cli_plan.py) but are not shown
    assert "--num-rollout " not in helps["train"] and "--expected-rollouts" not in helps["gate"]


@pytest.mark.parametrize(
    ("command", "kind"), [("gate", "plain"), ("compare", "file"), ("baseline record", "missing")]
)
def test_a_dir_that_is_no_run_dir_is_one_line_and_nothing_written(
    runs: dict[str, Path], tmp_path: Path, command: str, kind: str
) -> None:
    target = runs[kind] if kind != "missing" else tmp_path / "missing"
    before = tree(target) if target.is_dir() else None
    args = {
        "gate": gate(target),
        "compare": ["compare", "--run-dir", str(runs["pass"]), "--run-dir", str(target)],
        "baseline record": ["baseline", "record", "--run-dir", str(target), "--variant",
                            "patched", "--out", str(tmp_path / "patched.json")],
    }[command]  # fmt: skip
    expected = {"plain": "not a run directory", "file": "is a file", "missing": "no such"}
    one_error_line(run_cli(*args), f"--run-dir {target}", expected[kind])
    assert (tree(target) if target.is_dir() else None) == before
    assert kind == "file" or not target.exists() or target.is_dir()
    assert not (tmp_path / "patched.json").exists()
    assert not (runs["pass"] / "report").exists()


def test_gate_appends_only_to_a_named_history(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("MILES_AMD_HISTORY", raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    args = gate(runs["pass"], "--report-dir")
    unnamed = run_cli(*args, str(tmp_path / "r1"))
    assert unnamed.returncode == 0, unnamed.stderr
    assert "history:" not in unnamed.stdout + unnamed.stderr
    assert [p for p in home.rglob("*") if p.suffix == ".sqlite"] == []  # (matplotlib caches)
    assert not (home / "data").exists() and not (home / ".local").exists()
    named = tmp_path / "h.sqlite"
    env = {**os.environ, "MILES_AMD_HISTORY": str(named)}
    from_env = run_cli(*args, str(tmp_path / "r2"), env=env)
    assert f"history: appended as run 1 to {named}" in from_env.stdout
    ignored = run_cli(*args, str(tmp_path / "r3"), "--no-history", env=env)
    assert ignored.returncode == 0 and "history:" not in ignored.stdout + ignored.stderr
    before = named.read_bytes()
    listed = run_cli("history", "--history", str(named), "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert [r["verdict"] for r in json.loads(listed.stdout)["runs"]] == ["pass"]
    assert named.read_bytes() == before  # listing is read-only


def test_history_never_creates_or_modifies_a_file(
    runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MILES_AMD_HISTORY", raising=False)
    one_error_line(run_cli("history"), "--history", "MILES_AMD_HISTORY")
    missing = tmp_path / "sub" / "none.sqlite"
    one_error_line(run_cli("history", "--history", str(missing)), f"--history {missing}")
    assert not missing.parent.exists()
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    one_error_line(run_cli("history", "--history", str(empty)), "not a miles-amd history")
    assert empty.stat().st_size == 0 and [p.name for p in tmp_path.iterdir()] == ["empty.sqlite"]
    bogus = run_cli("history", "--history", str(runs["history"]), "--variant", "bogus")
    one_error_line(bogus, "bogus", "stock")


def test_no_proxy_has_no_duplicate_entry() -> None:
    from miles_amd.recipe.plan import job_env_vars
    from miles_amd.recipe.settings import Recipe

    assert job_env_vars(Recipe(), {}, "127.0.0.1", None)["no_proxy"] == "127.0.0.1"
    assert job_env_vars(Recipe(), {}, "10.0.0.5", None)["no_proxy"] == "127.0.0.1,10.0.0.5"


def test_the_errors_every_command_maps_are_named_by_their_classes() -> None:
    """``add_command`` matches errors by class name (no import): a renamed class fails here."""
    from miles_amd.app import AppError
    from miles_amd.app.train import CanaryRed
    from miles_amd.baseline.record import RecordError
    from miles_amd.cli.options import exit_code_of
    from miles_amd.recipe.inputs import InputError
    from miles_amd.recipe.settings import HardwareDetectionError, RecipeError
    from miles_amd.run.cluster import ClusterError
    from miles_amd.run.dashboard import DashboardError
    from miles_amd.run.driver import DriverError
    from miles_amd.run.variants_run import VariantsError

    bad = (AppError, ClusterError, DashboardError, HardwareDetectionError, InputError,
           RecipeError, RecordError, VariantsError)  # fmt: skip
    assert {exit_code_of(cls("x")) for cls in bad} == {2}
    assert exit_code_of(CanaryRed("x")) == 1
    assert exit_code_of(DriverError("x", exit_code=2)) == 2
    assert exit_code_of(ValueError("x")) is None and exit_code_of(OSError("x")) is None
