"""The acceptance run on an 8x MI355X node: preflight, the canary, the recipe for real, the gate.

``pytest -m mi355x --runslow --aiter-variant stock|patched``. Both variants exist as tests;
the one this image does not carry is skipped with the reason (CI runs each variant in its
own matrix leg). The run is the recipe as ``miles-amd train --aiter-variant V`` launches it:
the all-reduce canary of the variant first (``miles-amd canary``; a patched or rccl red stops
before the long run and fails the test with its line, ``app.train.CanaryRed``), then the
same driver the CPU rehearsal proves, judged against ``baselines/`` for the variant (the
gate's ``allreduce.canary`` included). On failure the assertion carries the report's failing
rows and the path to ``report.md``.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from miles_amd.app.baselines import for_variant, load
from miles_amd.app.train import run_and_gate
from miles_amd.recipe.plan import CANARY_STEP, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.preflight import (
    PreflightConfig,
    preflight_ok,
    run_preflight,
    write_env_json,
)
from miles_amd.run.preflight_view import shown, table
from miles_amd.run_dir import RunDir

pytestmark = pytest.mark.mi355x

RUN_TIMEOUT_S = 5400  # the published runs took about 66 minutes


def preflight(node, variant: str):
    config = PreflightConfig(
        model_dir=node.model_dir,
        data_dir=node.data_dir,
        miles_dir=node.miles_dir,
        megatron_dir=node.megatron_dir,
        run_dir=node.run_dir(variant),
        aiter_variant=variant,
    )
    facts = run_preflight(config)
    write_env_json(facts, config.run_dir, {"config": config.as_dict()})
    return facts


def test_preflight(node) -> None:
    facts = preflight(node, node.aiter_variant)
    assert preflight_ok(facts), "preflight found problems:\n" + table(shown(facts), verbose=True)


@pytest.mark.timeout(RUN_TIMEOUT_S + 600)
@pytest.mark.parametrize("variant", ["stock", "patched", "rccl"])
def test_recipe_matches_baseline(node, variant: str) -> None:
    if variant != node.aiter_variant:
        pytest.skip(
            f"other aiter variant: this run tests {node.aiter_variant!r}; {variant!r} runs "
            f"with --aiter-variant {variant} in its own image/CI leg"
        )
    run_dir = node.run_dir(variant)
    shutil.rmtree(run_dir, ignore_errors=True)  # this test's own output of an earlier run
    facts = preflight(node, variant)
    assert preflight_ok(facts), "preflight found problems:\n" + table(shown(facts), verbose=True)
    recipe = Recipe(
        model_dir=str(node.model_dir),
        data_dir=str(node.data_dir),
        miles_dir=str(node.miles_dir),
        megatron_dir=str(node.megatron_dir),
        num_rollout=node.num_rollouts,
    )
    plan = build_train_plan(
        recipe, dict(os.environ), run_dir=str(run_dir), aiter_variant=variant, canary=True
    )
    assert plan.steps[0].name == CANARY_STEP  # after the preflight, before the long run
    baseline = load(for_variant(variant), "--gate")  # rccl: stock's, applied baseline-free
    outcome = run_and_gate(plan, timeout_s=RUN_TIMEOUT_S, gate=baseline, require_env=True)
    report_md = RunDir(run_dir).report / "report.md"
    report = json.loads((RunDir(run_dir).report / "report.json").read_text())
    failing = [row for row in report["checks"] if row["status"] not in ("pass", "not_measured")]
    assert outcome.verdict == "pass", (
        f"{outcome.summary()}\nfailing checks:\n"
        + "\n".join(f"- {r['name']}: {r.get('detail', '')}" for r in failing)
        + f"\nfull report: {report_md}"
    )
