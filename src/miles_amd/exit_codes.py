"""The exit codes of the ``miles-amd`` commands and of the driver.

Decides the numbers and the sentence each command's help ends with
(``tests/unit/test_cli_interface.py``); it imports nothing of this package, so the judge, the
driver and the CLI can take their codes from here:

- 0 success (the gate passed, the plan was printed, the history listed),
- 1 the run, the gate or the preflight failed (the job failed, a check failed, a fact is
  not ok),
- 2 unusable input: a flag, a file or a directory the command cannot use; nothing is
  started or half-written, and one line on stderr names the flag or file and the fix,
- 130 interrupted (Ctrl-C).

The code is the verdict whatever happens to stdout or stderr: a reader that closes the pipe
early (``| head -2``) changes nothing (``miles_amd.cli.output``).

Explained for people in ``docs/cli.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CODES_HELP",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "VERDICT_EXIT_CODES",
    "VerdictName",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

VerdictName = Literal["pass", "fail", "error"]
# The gate's verdicts: "error" is evidence that is not there at all, i.e. unusable input.
VERDICT_EXIT_CODES: Mapping[VerdictName, int] = {
    "pass": EXIT_OK,
    "fail": EXIT_FAILED,
    "error": EXIT_BAD_INPUT,
}

EXIT_CODES_HELP = (
    f"Exit codes: {EXIT_OK} success, {EXIT_FAILED} the run, the gate or the preflight failed, "
    f"{EXIT_BAD_INPUT} bad input (one line on stderr naming the flag and the fix; nothing is "
    f"started), {EXIT_INTERRUPTED} interrupted. A closed stdout (| head) changes no code."
)
