"""Which baseline judges what: by name or path, and for the fail-fast watcher.

A shipped baseline must also carry the recipe's required rules and pinned evidence; an
ungated run is watched with the patched baseline's reference-free rules and no looks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from miles_amd.app import AppError

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.rules.check import Check
    from miles_amd.rules.model import Baseline

__all__ = ["identity", "load", "watch_rules"]


def load(spec: str, flag: str) -> Baseline:
    """The baseline ``spec`` names (stock, patched or a path); ``AppError`` naming ``flag``."""
    from miles_amd.baseline.model import BaselineError, UnknownBaselineError, load_baseline
    from miles_amd.baseline.shipped import check_shipped

    try:
        baseline = load_baseline(spec, flag=flag)
        check_shipped(spec, baseline)
        return baseline
    except UnknownBaselineError as exc:
        raise AppError(str(exc)) from None  # it names the flag and the fix
    except BaselineError as exc:
        message = str(exc)  # it starts with the file's path when the file was read
        line = f"{flag} {message}" if message.startswith(spec) else f"{flag} {spec}: {message}"
        raise AppError(line) from None


def identity(baseline: Baseline) -> tuple[str, str | None]:
    """``baseline``'s digest and the shipped one of its name's (None: none, or unloadable)."""
    from miles_amd.baseline.model import SHIPPED, BaselineError, load_baseline
    from miles_amd.baseline.shipped import baseline_digest

    digest = baseline_digest(baseline)
    if baseline.name not in SHIPPED:
        return digest, None
    try:
        return digest, baseline_digest(load_baseline(baseline.name))
    except BaselineError:
        return digest, None


def watch_rules(gate: Baseline | None) -> Callable[[RunEvidence], list[Check]]:
    from miles_amd.judge.gate import early_failures

    if gate is not None:
        return lambda evidence: early_failures(evidence, gate)
    reference = load("patched", "--gate")
    return lambda evidence: early_failures(evidence, reference, looks=False, reference_free=True)
