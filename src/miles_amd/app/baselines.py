"""Which baseline judges what: loading one by name or path, per variant, for the watcher.

- :func:`load`: a shipped name (``stock``, ``patched``) or a path; a bad one is
  :class:`~miles_amd.app.errors.AppError` naming the flag and the fix; a shipped one must
  also carry the recipe's required rules and its pinned evidence
  (``miles_amd.baseline.shipped.check_shipped``).
- :func:`for_variant`: the shipped baseline a variant is gated against: its own, else (the
  rccl control arm, which has none) stock's, applied baseline-free by the gate
  (``judge.sequential``).
- :func:`identity`: the baseline's digest and the shipped one of its name's
  (``miles_amd.baseline.shipped.baseline_digest``), for the gate to print and record; in CI
  the shipped baselines are the base branch's (``$MILES_AMD_BASELINES_DIR``, docs/ci.md).
- :func:`watch_rules`: what the fail-fast watcher applies to a run still being written: the
  gate's own rules at the looks the run has reached (``judge.gate.early_failures``)
  against the run's baseline; a run that is not gated is watched with the patched one's
  rules that take nothing from the reference (the spike threshold, finiteness, the reward
  grid, the steps, fatal sentinels: the same in both) and no looks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from miles_amd.app.errors import AppError

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.rules.check import Check
    from miles_amd.rules.model import Baseline

__all__ = ["for_variant", "identity", "load", "watch_rules"]


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
    """``baseline``'s digest and the shipped baseline of its name's (``None``: no shipped
    baseline of that name, or it does not load, which ``--baseline NAME`` would say)."""
    from miles_amd.baseline.model import SHIPPED, BaselineError, load_baseline
    from miles_amd.baseline.shipped import baseline_digest

    digest = baseline_digest(baseline)
    if baseline.name not in SHIPPED:
        return digest, None
    try:
        shipped = load_baseline(baseline.name)
    except BaselineError:
        return digest, None
    return digest, baseline_digest(shipped)


def for_variant(variant: str) -> str:
    """The shipped baseline ``variant`` is gated against (module doc)."""
    from miles_amd.baseline.keys import template_for

    return template_for(variant)


def watch_rules(gate: Baseline | None) -> Callable[[RunEvidence], list[Check]]:
    """The watcher's judge of partial evidence (module doc)."""
    from miles_amd.judge.gate import early_failures

    if gate is not None:
        return lambda evidence: early_failures(evidence, gate)
    reference = load("patched", "--gate")
    return lambda evidence: early_failures(evidence, reference, looks=False, reference_free=True)
