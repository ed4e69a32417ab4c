"""Run a plan and gate what it wrote: the canary first, then the driver, then the gate.

The run stops (:class:`CanaryRed`, exit 1) exactly when the gate's ``allreduce.canary`` check
fails on the canary's canary.json; an unusable canary is an ``AppError`` naming
``--no-canary``. The exit code is the gate's, else the job's; evidence not pulled back from the
job's node fails either way. ``--variants`` gates each job against its variant's baseline.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.app import AppError
from miles_amd.app.baselines import load, watch_rules
from miles_amd.app.gate import GateResult, gate_run_dir
from miles_amd.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED

if TYPE_CHECKING:
    from miles_amd.recipe.plan import LaunchPlan
    from miles_amd.rules.check import Check
    from miles_amd.rules.model import Baseline
    from miles_amd.run.driver import RunOutcome

__all__ = ["CanaryRed", "TrainResult", "run_and_gate", "run_canary", "run_variants"]

# the published 20-rollout runs took "about 1h06m" (the shipped baselines' provenance)
PUBLISHED_RUN_MINUTES = 66
PUBLISHED_ROLLOUTS = 20
Command = Callable[[Sequence[str]], int]


class CanaryRed(RuntimeError):
    """The canary found the run's all-reduce wrong; ``str()`` is one line."""


def miles_amd_command(argv: Sequence[str]) -> int:  # argv[0] is miles-amd
    return subprocess.run([sys.executable, "-m", "miles_amd.cli", *argv[1:]]).returncode


def run_canary(
    plan: LaunchPlan,
    *,
    require_env: bool = False,
    command: Command = miles_amd_command,
    echo: Callable[[str], None] = print,
) -> Check | None:
    """The plan's canary step run and judged; None when the plan has none."""
    from miles_amd.evidence.load import load_run
    from miles_amd.judge.canary import canary_check
    from miles_amd.recipe.plan import CANARY_STEP

    step = next((s for s in plan.steps if s.name == CANARY_STEP), None)
    if step is None or plan.run_dir is None:
        return None
    echo(f"canary: {' '.join(step.argv)} (before the job; --no-canary skips it)")
    code = command(step.argv)
    if code == EXIT_BAD_INPUT:
        raise AppError(
            "the all-reduce canary is unusable here (its line above names the fix); fix it, "
            "or pass --no-canary to run without it (the gate then shows it not measured)"
        )
    evidence = load_run(plan.run_dir) if Path(plan.run_dir).is_dir() else None
    if evidence is None or evidence.canary is None:
        problems = evidence.problems if evidence is not None else ()
        why = "; ".join(
            str(p) for p in problems if p.source == "canary_json" or "refused" in p.detail
        )
        raise AppError(
            f"the all-reduce canary (exit {code}) left no readable canary.json in "
            f"{plan.run_dir}{': ' + why if why else ''}; fix it, or pass --no-canary"
        )
    check = canary_check(evidence, evidence.variant or plan.aiter_variant, require_env=require_env)
    if check.failed:
        minutes = round(PUBLISHED_RUN_MINUTES * plan.recipe.num_rollout / PUBLISHED_ROLLOUTS)
        found = "the kernel wrong" if evidence.canary.mismatches else "no evidence for this run"
        raise CanaryRed(
            f"the all-reduce canary found {found}: {check.detail}; the run was not started: "
            f"about {minutes} node-minutes saved (the published "
            f"{PUBLISHED_ROLLOUTS}-rollout runs took about {PUBLISHED_RUN_MINUTES} minutes); "
            f"canary.json is in {plan.run_dir}"
        )
    echo(f"canary: {check.status}: {check.detail}")
    return check


@dataclass(frozen=True)
class TrainResult:
    outcome: RunOutcome
    gate: GateResult | None = None

    @property
    def verdict(self) -> str | None:
        return self.gate.verdict.verdict if self.gate is not None else None

    @property
    def exit_code(self) -> int:
        code = self.gate.verdict.exit_code if self.gate is not None else self.outcome.exit_code
        return max(code, EXIT_FAILED) if self.outcome.pullback_error else code

    def summary(self) -> str:
        line = self.outcome.summary()
        if self.gate is None:
            return line
        from miles_amd.report.render import verdict_label

        verdict = verdict_label(self.gate.verdict)  # says a stock run's expected failure
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
    canary_command: Command = miles_amd_command,
) -> TrainResult:
    from miles_amd.run.driver import execute

    run_canary(plan, require_env=require_env, command=canary_command, echo=echo)

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
    echo: Callable[[str], None] = print,
) -> dict[str, TrainResult | BaseException]:
    """Every variant's run, gated; a raised driver's result is its error."""
    from miles_amd.baseline.keys import template_for
    from miles_amd.run.driver import RunOutcome
    from miles_amd.run.variants_run import execute_variants

    baselines = {v: load(template_for(v), "--variants") for v in plans}
    watches = {v: watch_rules(b) for v, b in baselines.items()}
    outcomes = execute_variants(plans, watches, timeout_s=timeout_s, echo=echo)
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
    outcome: RunOutcome, plan: LaunchPlan, gate: Baseline | None, require_env: bool,
    history: Path | None,
) -> GateResult | None:  # fmt: skip
    if gate is None:
        return None
    return gate_run_dir(
        outcome.run_dir, gate, expected_rollouts=plan.recipe.num_rollout,
        require_env=require_env, history=history,
    )  # fmt: skip
