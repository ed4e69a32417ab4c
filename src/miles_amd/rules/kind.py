"""What one rule kind declares: :class:`KindSpec`, the ``SPEC`` of each kind module.

Decides the shape of a kind's declaration (which functions and flags every kind gives the
gate, the loader, ``baseline record`` and ``baseline diff``); it declares no kind itself
(``miles_amd.rules.kinds``) and looks none up (``miles_amd.rules.registry``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from miles_amd.evidence.types import Series
from miles_amd.rules.check import Check, Problem, RuleContext
from miles_amd.rules.model import Baseline, KindName, Params, Rule

LookMode = Literal["at_once", "spending", "final"]


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
    - ``summary``: figures ``baseline record`` adds to the metric's summary;
    - ``rederive``: params ``baseline record`` re-derives from the recorded run (a band, the
      reward's sd floor), merged over the template's;
    - ``looks``: how the kind is judged on the first ``k`` rollouts of a run (``k`` below
      the run's rollouts; ``miles_amd.rules.looks``): ``at_once`` (a value that fails it now
      fails the whole run: a spike, a non-finite or off-grid value, a step seen twice; the
      watcher stops the run at it), ``spending`` (a statistic with a boundary that spends
      part of the rule's false-alarm rate at each declared look) or ``final`` (only the
      whole run decides: the job's end state, the reward's spread);
    - ``information``: a ``spending`` kind's information on the first ``k`` of ``N``
      rollouts (rule, baseline, k, N), from the reference alone (one over the variance of
      its estimate; the variance of Mann-Kendall's S); ``None`` when ``k`` rollouts cannot
      judge it (the step rule before its mid-run split);
    - ``nominal``: a ``spending`` kind's fixed-sample rate (rule, baseline, N) -> (the
      one-sided rate of a side, the number of sides): the false-alarm rate it spends;
    - ``needs_series``: False when judged from job.json rather than from a metric;
    - ``reference_series``: the rule needs the reference's per-rollout series (so a recorded
      baseline needs the run's own series of that metric);
    - ``needs_spread``: the rule's tolerance needs the reference's per-rollout spread (its
      series, or a summary to carry over), as a band does.
    """

    name: KindName
    params: type[Params]
    check: Callable[[Rule, Series, RuleContext], Check]
    expected: Callable[[Rule, Baseline, int], str]
    reference: Callable[[Rule, Baseline], str] = no_reference
    validate: Callable[[Rule, Baseline], Problem | None] = nothing_to_validate
    summary: Callable[[Rule, list[float]], dict[str, Any]] | None = None
    rederive: Callable[[Rule, Baseline, int], Mapping[str, Any]] | None = None
    looks: LookMode = "final"
    information: Callable[[Rule, Baseline, int, int], float | None] | None = None
    nominal: Callable[[Rule, Baseline, int], tuple[float, int]] | None = None
    needs_series: bool = True
    reference_series: bool = False
    needs_spread: bool = False
