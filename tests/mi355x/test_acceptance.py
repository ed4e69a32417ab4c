"""The acceptance run on an 8x MI355X node (``pytest -m mi355x --runslow --aiter-variant V``):
preflight, the variant's canary, the recipe as ``miles-amd train`` launches it, judged against
the reviewed baseline of the node's key; a stock run ROCm/aiter#5694 explains is xfail
(docs/node.md).
"""

from __future__ import annotations

import json
import os

import pytest

from miles_amd.app.baselines import load
from miles_amd.app.train import run_and_gate
from miles_amd.baseline.keys import BaselineKey, reviewed_path, template_for
from miles_amd.recipe.plan import CANARY_STEP, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.preflight import preflight_ok, shown, table
from miles_amd.run_dir import RunDir

pytestmark = pytest.mark.mi355x

RUN_TIMEOUT_S = 5400  # the published runs took about 66 minutes


def test_preflight(preflighted) -> None:
    assert preflight_ok(preflighted), "preflight found problems:\n" + table(
        shown(preflighted), verbose=True
    )


@pytest.mark.timeout(RUN_TIMEOUT_S + 600)
def test_recipe_matches_baseline(node, preflighted) -> None:
    variant, run_dir = node.aiter_variant, node.run_dir
    assert preflight_ok(preflighted), "preflight found problems (see test_preflight)"
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
    gpu = next((f.value for f in preflighted if f.name == "gpu_model"), "")
    key = BaselineKey("8gpu", gpu.split()[0] if gpu else "unknown", template_for(variant))
    path = reviewed_path(key)
    assert path is not None, (
        f"no reviewed baseline for {key}: gate runs of this node with `miles-amd gate "
        "--baseline auto` into a history, then `miles-amd baseline record --from-history`"
    )
    baseline = load(str(path), "--gate")  # rccl: stock's, applied baseline-free
    outcome = run_and_gate(plan, timeout_s=RUN_TIMEOUT_S, gate=baseline, require_env=True)
    report_md = RunDir(run_dir).report / "report.md"
    expected = outcome.gate.verdict.expected_failure if outcome.gate is not None else None
    if expected is not None:
        pytest.xfail(f"{expected.line} (report: {report_md})")
    report = json.loads((RunDir(run_dir).report / "report.json").read_text())
    failing = [row for row in report["checks"] if row["status"] not in ("pass", "not_measured")]
    assert outcome.verdict == "pass", (
        f"{outcome.summary()}\nfailing checks:\n"
        + "\n".join(f"- {r['name']}: {r.get('detail', '')}" for r in failing)
        + f"\nfull report: {report_md}"
    )
