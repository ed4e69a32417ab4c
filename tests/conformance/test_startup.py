"""Start-up smoke: miles' real ``train()`` runs the recipe on CPU up to SGLang's engine init.

The job ``miles-amd train`` plans (``build_train_plan``: the default recipe, a run dir, the
pinned miles and Megatron-LM) is started under a private local Ray head that declares the
recipe's 8 GPUs on a CPU-only machine (``startup.py`` says what is the same as on a node and
what differs). The checkpoint dir is the fake one of ``fake_inputs.py`` plus a stand-in
tokenizer. ``train()`` must get through parsing, the placement group of 8 GPU bundles, the
rollout manager (dataset, tokenizer, rollout function), miles' router and the creation of
8 / 4 = 2 rollout engines, and stop in SGLang's engine initialisation
(``ServerArgs(**server_args_dict)`` -> ``get_device``: "No accelerator"), the first place that
needs a GPU. A stop anywhere earlier fails with the stage it missed, the flags or env that
stage depends on, and the driver's last exception (``startup_evidence.py``).

Every process the run started (found by the head's private ``TMPDIR`` in its environment,
orphans included) is stopped by pid, and the test fails if one is left.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from miles_amd.recipe.plan import LaunchPlan, build_train_plan
from miles_amd.recipe.settings import Recipe
from tests.conformance import startup, startup_evidence
from tests.conformance.checkout import MilesCheckout
from tests.conformance.fake_inputs import MODEL_SUBDIR, STAND_IN_TOKENIZER_SCRIPT, make_fake_inputs

# one run of train() for the module's tests (xdist --dist loadgroup)
pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("startup")]

DRIVER_TIMEOUT_S = 420.0  # a wedged start, not a slow one: the run takes ~3 min


@dataclass(frozen=True)
class Startup:
    plan: LaunchPlan
    returncode: int | None
    log: str
    log_path: Path
    left: list[int]

    @property
    def num_engines(self) -> int:
        return self.plan.recipe.num_gpus // self.plan.recipe.rollout_num_gpus_per_engine


def _plan(checkout: MilesCheckout, root: Path) -> LaunchPlan:
    model_dir, data_dir = make_fake_inputs(root / "inputs")
    subprocess.run(
        [str(checkout.python), "-c", STAND_IN_TOKENIZER_SCRIPT, str(model_dir / MODEL_SUBDIR)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    recipe = Recipe(
        model_dir=str(model_dir),
        data_dir=str(data_dir),
        miles_dir=str(checkout.miles),
        megatron_dir=str(checkout.megatron),
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return build_train_plan(recipe, env, run_dir=str(root / "run"), state_dir=str(root / "state"))


@pytest.fixture(scope="module")
def started(checkout: MilesCheckout, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Startup]:
    root = tmp_path_factory.mktemp("startup")
    plan = _plan(checkout, root)
    run, head_env, gcs_port = startup.start_head(plan, checkout, root)
    try:
        startup.start_driver(run, plan, checkout, head_env, gcs_port)
        returncode = run.wait_driver(DRIVER_TIMEOUT_S)
    finally:
        left = run.stop()
    log = startup_evidence.clean(run.driver_log.read_text(errors="replace"))
    yield Startup(plan, returncode, log, run.driver_log, left)


def test_startup_stops_exactly_at_sglang_engine_init(started: Startup) -> None:
    assert started.returncode is not None, (
        f"train() did not stop within {DRIVER_TIMEOUT_S:g} s (log: {started.log_path})"
    )
    missing = startup_evidence.first_missing(
        started.log, started.plan.recipe.num_gpus, started.num_engines
    )
    assert missing is None, (
        f"train() stopped before the stage '{missing.name}': {missing.defect}; "
        f"its last error: {startup_evidence.last_error(started.log)} (log: {started.log_path})"
    )
    assert started.returncode != 0
    # the driver ends on the rollout manager's creation failing with the engines' error
    assert re.search(startup_evidence.DRIVER_STOP, started.log), startup_evidence.last_error(
        started.log
    )


def test_startup_created_the_gpus_and_both_rollout_engines(started: Startup) -> None:
    log, recipe = started.log, started.plan.recipe
    assert startup_evidence.count(r"bundle\s+(\d+), actual_bundle_index", log) == recipe.num_gpus
    engines = startup_evidence.count(r"Actor\(SGLangEngine, ([0-9a-f]+)\)", log)
    assert (engines, started.num_engines) == (2, 2)
    ports = startup_evidence.count(r"Ports for engine (\d+)", log)
    assert ports == started.num_engines


def test_startup_leaves_no_process_behind(started: Startup) -> None:
    assert started.left == [], f"processes of the start-up smoke still alive: {started.left}"


def test_startup_names_the_stage_of_an_earlier_stop(started: Startup) -> None:
    """The reader on the real log cut short before each stage's proof names that stage, or
    an earlier one whose proof the cut also removed: the actors log concurrently, so on a
    loaded machine a later stage's line can precede an earlier stage's."""
    recipe = started.plan.recipe
    lines = started.log.splitlines()
    stages = startup_evidence.stages(recipe.num_gpus, started.num_engines)
    for index, stage in enumerate(stages):
        cut = next(i for i in range(len(lines) + 1) if stage.reached("\n".join(lines[:i])))
        shorter = "\n".join(lines[: cut - 1])
        assert not stage.reached(shorter), stage.name
        missing = startup_evidence.first_missing(shorter, recipe.num_gpus, started.num_engines)
        earlier_cut = [s.name for s in stages[:index] if not s.reached(shorter)]
        assert missing is not None and missing.name == (earlier_cut or [stage.name])[0], (
            stage.name,
            missing,
        )
