"""Run ``miles-amd`` as a user does: in this process, or as a real process where one is needed.

:func:`run_cli` runs the console script's entry (:func:`miles_amd.cli.main.main`) inside
typer's ``CliRunner`` isolation: the user's exit path, stdout and stderr apart, ``env`` (a
whole environment, as ``subprocess.run`` takes it) and ``cwd`` in place for the call; an
unexpected exception reaches the test. :func:`run_cli_process` starts ``python -m
miles_amd.cli`` for what only a process shows (a closed pipe, a child's environment).
"""

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
    """``text`` with every run of whitespace one space: a wrapped line reads as one (the
    terminal renderers wrap at 100 columns, ``miles_amd.wrap``)."""
    return " ".join(text.split())


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def environment_overlay(env: Mapping[str, str]) -> dict[str, str | None]:
    """``os.environ`` -> ``env`` as the overrides ``CliRunner`` takes (None deletes a key)."""
    return {key: env.get(key) for key in {*os.environ, *env}}


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
    overlay = environment_overlay(env) if env is not None else None
    with (
        CliRunner().isolation(env=overlay) as (stdout, stderr, _),
        working_dir(cwd),
    ):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code
        else:  # pragma: no cover - main() always exits
            raise AssertionError("miles_amd.cli.main.main returned instead of exiting")
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        if not isinstance(code, int | None):
            sys.stderr.write(f"{code}\n")
            sys.stderr.flush()
            code = 1
        return CliRun(code or 0, stdout.getvalue().decode(), stderr.getvalue().decode())


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
