"""Run a plan and gate what it wrote: the driver runs and records, then the gate judges.

- :func:`run_and_gate`: the driver (``miles_amd.run.driver.execute``) with the fail-fast
  watcher's rules (``app.baselines.watch_rules`` of the gate's baseline), then, when a
  baseline is given, :func:`miles_amd.app.gate.gate_run_dir` on the run dir with the plan's
  rollout count. The exit code is the gate's when gated, else the job's; evidence that did not
  come back from the job's node (cluster mode) is a failure either way.
- :func:`run_variants`: ``train --variants``: the variants' jobs concurrently
  (``miles_amd.run.variants_run``), each watched and then gated against
  ``app.baselines.for_variant`` of its name. The A/B comparison is ``app.compare``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.app.baselines import for_variant, load, watch_rules
from miles_amd.app.gate import GateResult, gate_run_dir
from miles_amd.exit_codes import EXIT_FAILED

if TYPE_CHECKING:
    from miles_amd.recipe.plan import LaunchPlan
    from miles_amd.rules.model import Baseline
    from miles_amd.run.driver import RunOutcome

__all__ = ["TrainResult", "run_and_gate", "run_variants"]


@dataclass(frozen=True)
class TrainResult:
    """A run's outcome and, when it was gated, the gate's result."""

    outcome: RunOutcome
    gate: GateResult | None = None

    @property
    def verdict(self) -> str | None:
        """The gate's verdict (pass, fail, error); None when the run was not gated."""
        return self.gate.verdict.verdict if self.gate is not None else None

    @property
    def exit_code(self) -> int:
        code = self.gate.exit_code if self.gate is not None else self.outcome.exit_code
        return max(code, EXIT_FAILED) if self.outcome.pullback_error else code

    def summary(self) -> str:
        line = self.outcome.summary()
        if self.gate is None:
            return line
        verdict = self.gate.verdict.verdict.upper()
        return f"{line}; gate: {verdict} (report in {self.gate.files.markdown.parent}/)"


def run_and_gate(
    plan: LaunchPlan,
    *,
    timeout_s: float,
    gate: Baseline | None = None,
    require_env: bool = False,
    history: Path | None = None,
    state_dir: str | None = None,
    watch_interval_s: float = 10.0,
    echo: Callable[[str], None] = print,
) -> TrainResult:
    """Run ``plan``, then gate it against ``gate`` if given (module doc)."""
    from miles_amd.run.driver import execute

    outcome = execute(
        plan,
        timeout_s=timeout_s,
        watch=watch_rules(gate),
        state_dir=state_dir,
        watch_interval_s=watch_interval_s,
        echo=echo,
    )
    return TrainResult(outcome, _gate(outcome, plan, gate, require_env, history))


def run_variants(
    plans: Mapping[str, LaunchPlan],
    *,
    timeout_s: float,
    require_env: bool = False,
    state_dir: str | None = None,
    watch_interval_s: float = 10.0,
    echo: Callable[[str], None] = print,
) -> dict[str, TrainResult | BaseException]:
    """Every variant's run, gated against its baseline; a variant whose driver raised has
    the exception as its result. Baselines load first (``AppError`` before anything runs)."""
    from miles_amd.run.driver import RunOutcome
    from miles_amd.run.variants_run import execute_variants

    baselines = {v: load(for_variant(v), "--variants") for v in plans}
    outcomes = execute_variants(
        plans,
        {v: watch_rules(b) for v, b in baselines.items()},
        timeout_s=timeout_s,
        state_dir=state_dir,
        watch_interval_s=watch_interval_s,
        echo=echo,
    )
    results: dict[str, TrainResult | BaseException] = {}
    for variant, outcome in outcomes.items():
        if not isinstance(outcome, RunOutcome):
            results[variant] = outcome
            continue
        try:
            gated = _gate(outcome, plans[variant], baselines[variant], require_env, None)
            results[variant] = TrainResult(outcome, gated)
        except OSError as exc:
            results[variant] = exc
    return results


def _gate(
    outcome: RunOutcome,
    plan: LaunchPlan,
    gate: Baseline | None,
    require_env: bool,
    history: Path | None,
) -> GateResult | None:
    if gate is None:
        return None
    return gate_run_dir(
        outcome.run_dir,
        gate,
        expected_rollouts=plan.recipe.num_rollout,
        require_env=require_env,
        history=history,
    )
