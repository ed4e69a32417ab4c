"""The exit codes of the ``miles-amd`` commands and of the driver, and their help sentence:
0 success, 1 the run, gate or preflight failed, 2 unusable input, 130 interrupted, whatever
happens to stdout. Imports nothing of this package. Explained in ``docs/cli.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

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
