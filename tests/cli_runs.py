"""Run ``miles-amd`` as a user does: in this process (``CliRunner`` isolation around the
console script's entry, :func:`run_cli`), or as a real process where only one shows it
(:func:`run_cli_process`: a closed pipe, a child's environment)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from miles_amd.cli.main import main


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space: a wrapped line reads as one."""
    return " ".join(text.split())


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def working_dir(cwd: Path | None) -> Iterator[None]:  # contextlib.chdir is 3.11+
    before = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(before)


def run_cli(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> CliRun:
    # os.environ -> env as the overrides CliRunner takes (None deletes a key)
    overlay = None if env is None else {key: env.get(key) for key in {*os.environ, *env}}
    with (
        CliRunner().isolation(env=overlay) as (stdout, stderr, _),
        working_dir(cwd),
    ):
        try:
            main(list(args))
        except SystemExit as exc:  # main() always exits
            code = exc.code
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        if not isinstance(code, int | None):
            sys.stderr.write(f"{code}\n")
            sys.stderr.flush()
            code = 1
        return CliRun(code or 0, stdout.getvalue().decode(), stderr.getvalue().decode())


def one_error_line(done: CliRun, *needles: str, stdout: str = "") -> str:
    """The one ``miles-amd: error:`` line of an exit 2 holding ``needles``; stdout only
    ``stdout`` (a prefix; empty: nothing)."""
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout.startswith(stdout) and (stdout or done.stdout == ""), done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("miles-amd: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def run_cli_process(
    *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "miles_amd.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=None if env is None else dict(env),
        cwd=cwd,
    )
