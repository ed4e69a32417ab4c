"""What one rule kind declares: :class:`KindSpec`, the ``SPEC`` of each kind module.

Decides the shape of a kind's declaration (which functions and flags every kind gives the
gate, the loader, ``baseline record`` and ``baseline diff``); it declares no kind itself
(``miles_amd.rules.kinds``) and looks none up (``miles_amd.rules.registry``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from miles_amd.evidence.types import Series
from miles_amd.rules.check import Check, Problem, RuleContext
from miles_amd.rules.model import Baseline, KindName, Params, Rule


def no_reference(rule: Rule, baseline: Baseline) -> str:
    return "-"


def nothing_to_validate(rule: Rule, baseline: Baseline) -> Problem | None:
    return None


@dataclass(frozen=True)
class KindSpec:
    """Everything one kind of rule means.

    - ``name``: the ``kind`` written in a rule (the module's own name);
    - ``params``: the kind's fields (a :class:`~miles_amd.rules.model.Params` dataclass whose
      field names are the rule's JSON keys; the schema requires the same names);
    - ``check``: how a run is judged (the rule, the metric's non-empty series, the context ->
      one :class:`~miles_amd.rules.check.Check`);
    - ``expected``: the one sentence stating the tolerance for a run of N rollouts, shown as
      a check's ``expected`` by the gate and as the rule's tolerance by ``baseline diff``;
    - ``reference``: the reference data the tolerance is taken from, for ``baseline diff``;
    - ``validate``: the loader's check that a tolerance is the one its derivation gives, or
      lies in its declared sane range, so an absurd but self-consistent baseline is refused;
    - ``derive_method``: the ``miles_amd.rules.bands`` method of the kind's band (None: no
      band derived from the reference run's spread);
    - ``summary``: figures ``baseline record`` adds to the metric's summary;
    - ``rederive``: params ``baseline record`` re-derives from the recorded run (a band, the
      reward's sd floor), merged over the template's;
    - ``hard``: the rule can lose a partial run for good (the watcher's fail-fast set);
    - ``needs_series``: False when judged from job.json rather than from a metric;
    - ``reference_series``: the rule needs the reference's per-rollout series (so a recorded
      baseline needs the run's own series of that metric);
    - ``needs_spread``: the rule's tolerance needs the reference's per-rollout spread (its
      series, or a summary to carry over), as a kind with a ``derive_method`` does.
    """

    name: KindName
    params: type[Params]
    check: Callable[[Rule, Series, RuleContext], Check]
    expected: Callable[[Rule, Baseline, int], str]
    reference: Callable[[Rule, Baseline], str] = no_reference
    validate: Callable[[Rule, Baseline], Problem | None] = nothing_to_validate
    derive_method: str | None = None
    summary: Callable[[Rule, list[float]], dict[str, Any]] | None = None
    rederive: Callable[[Rule, Baseline, int], Mapping[str, Any]] | None = None
    hard: bool = False
    needs_series: bool = True
    reference_series: bool = False
    needs_spread: bool = False
