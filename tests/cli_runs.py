"""Run ``miles-amd`` as a user does: a real subprocess of this interpreter."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "miles_amd.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )
