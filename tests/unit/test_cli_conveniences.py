"""The CLI's small conveniences (issue 28 item 9), each on the real thing: Ctrl-C's one line
(a real SIGINT to a real process), shell completion (click's completion protocol in a real
process), the hint for a mistyped baseline name, what train says when ``--aiter-variant`` is
absent, and the progress of a long read (a real pseudo-terminal)."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.progress import Progress
from tests.cli_runs import run_cli


def test_ctrl_c_prints_one_line_naming_what_was_interrupted(tmp_path: Path) -> None:
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
    env["COMP_CWORD"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", "from miles_amd.cli.main import main; main()"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gate"]
    helped = run_cli("--help")
    assert "--install-completion" in helped.stdout


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("Patched", "(baseline names are lower case: --baseline patched)"),
        ("STOCK", "(baseline names are lower case: --baseline stock)"),
        ("rccl", "(rccl has no baseline of its own: a run of it is gated with --baseline stock"),
    ],
)
def test_a_mistyped_baseline_name_gets_a_hint(name: str, hint: str) -> None:
    done = run_cli("gate", "--example", "--baseline", name)
    assert done.returncode == 2
    assert done.stderr.startswith(f"miles-amd: error: --baseline {name}: no such baseline file")
    assert hint in done.stderr and "fix: use --baseline stock, --baseline patched" in done.stderr


def test_train_says_when_the_aiter_all_reduce_is_left_to_the_image(tmp_path: Path) -> None:
    dirs = ("--model-dir", str(tmp_path), "--data-dir", str(tmp_path))
    left = run_cli("train", "--dry-run", *dirs)
    assert left.returncode == 0, left.stderr
    assert left.stdout.splitlines()[-1].startswith(
        "aiter variant: not given; SGLANG_USE_AITER_AR (aiter's all-reduce or SGLang's) is "
        "left to the image"
    )
    chosen = run_cli("train", "--dry-run", *dirs, "--aiter-variant", "stock")
    assert "SGLANG_USE_AITER_AR is left" not in chosen.stdout


def test_progress_is_shown_on_a_terminal_and_cleared() -> None:
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        progress = Progress("reading job.log", 200 << 20, stream=terminal)
        progress.update(50 << 20)
        progress.close()
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal's other end closed: all read
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    text = shown.decode()
    assert text.startswith("\rreading job.log: 25% of 200 MB")
    assert text.endswith("\r" + " " * len("reading job.log: 25% of 200 MB") + "\r")


def test_no_progress_off_a_terminal_or_for_a_short_read() -> None:
    piped = io.StringIO()
    progress = Progress("reading job.log", 200 << 20, stream=piped)
    progress.update(100 << 20)
    progress.close()
    assert piped.getvalue() == ""
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        short = Progress("reading job.log", 1 << 20, stream=terminal)
        assert not short.on
    os.close(master)
