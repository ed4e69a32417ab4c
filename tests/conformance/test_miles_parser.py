"""Conformance: miles' real ``parse_args`` accepts every argv ``miles-amd train`` plans, and
hands ``train()`` the values the recipe means.

Every ``train`` variant of the snapshot suite is planned with the real CLI and its argv parsed
by the checkout's own parser in the env the driver submits (``harness.parse_all``: forked from
one import of miles per import path; the last test checks a fork against a fresh parse), on
fake inputs (``fake_inputs.py``). Stubs: the two GPU queries of ``miles_parse.py``, only when
torch sees no GPU, and inert ``triton``/``torchvision`` only in a python without them. Controls
that must fail: an unknown flag, ``--ci-enable-metrics-capture``, a missing
``CUDA_DEVICE_MAX_CONNECTIONS`` and a ``config.json`` that disagrees with the model flags.
docs/conformance.md says what it proves and why each stub is needed.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from miles_amd.recipe.settings import Recipe
from miles_amd.run.probes_miles import ParseOutcome
from tests.conformance import harness
from tests.conformance.checkout import MilesCheckout
from tests.conformance.conftest import UNKNOWN_FLAGS, parses
from tests.snapshot.test_dry_run import SECRET

# One xdist worker runs every parser test, so the parses (one batch: harness.parse_all) run once.
pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("miles-parse")]


def _why(outcome: ParseOutcome) -> str:
    return f"exit {outcome.returncode}: {outcome.message}\n{outcome.stderr[-3000:]}"


# The variants whose argv differs from the default's (the others change only the env).
CHANGING = ("default", "rollouts_3", "extra_args", "override_pinned", "wandb")
# Fields the test or the plan sets: the fake inputs and checkout, and the plan's switches
# (a run dir turns on capture_metrics, a W&B key use_wandb).
NOT_FROM_THE_VARIANT = (*harness.DIR_FIELDS, "capture_metrics", "use_wandb")


@pytest.mark.parametrize("case", sorted(harness.TRAIN_CASES))
def test_the_cli_plans_the_snapshot_variant(case: str, jobs: dict[str, harness.Job]) -> None:
    """The job parsed below is the snapshot case's recipe, planned by the real CLI."""
    planned = jobs[f"variant:{case}"].recipe
    differ = {
        key: (value, planned[key])
        for key, value in harness.snapshot_recipe(case).items()
        if key not in NOT_FROM_THE_VARIANT and planned[key] != value
    }
    assert differ == {}


@pytest.mark.parametrize("case", sorted(harness.TRAIN_CASES))
@parses("variant:{case}")
def test_real_miles_parses_the_planned_argv(
    case: str, jobs: dict[str, harness.Job], outcomes: dict[str, ParseOutcome]
) -> None:
    job, outcome = jobs[f"variant:{case}"], outcomes[f"variant:{case}"]
    assert outcome.ok, _why(outcome)
    assert outcome.args is not None
    assert harness.mismatches(harness.expected_values(job), outcome.args) == {}
    assert SECRET not in json.dumps(outcome.args)  # a W&B key travels in the env only


@parses(*(f"variant:{case}" for case in CHANGING))
def test_the_variants_change_what_they_mean(outcomes: dict[str, ParseOutcome]) -> None:
    """Each variant's effect reaches train(): not only 'it parses'."""
    args = {case: outcomes[f"variant:{case}"].args or {} for case in CHANGING}
    default = args["default"]
    assert default["num_rollout"] == Recipe().num_rollout
    assert args["rollouts_3"]["num_rollout"] == 3
    assert (args["extra_args"]["seed"], args["extra_args"]["log_probs_chunk_size"]) == (1234, 512)
    assert default["sglang_mem_fraction_static"] == Recipe().sglang_mem_fraction_static
    assert args["override_pinned"]["sglang_mem_fraction_static"] == 0.3
    assert (default["use_wandb"], args["wandb"]["use_wandb"]) == (False, True)
    assert args["wandb"]["wandb_key"] is None
    assert default["use_tensorboard"] and default["ci_enable_metrics_capture"]


@pytest.mark.parametrize("token", UNKNOWN_FLAGS)
@parses("unknown:{token}")
def test_an_unknown_flag_fails_with_the_parsers_message(
    token: str, outcomes: dict[str, ParseOutcome]
) -> None:
    outcome = outcomes[f"unknown:{token}"]
    assert outcome.returncode == 2, _why(outcome)
    assert outcome.message == f"unrecognized arguments: {token}"


@parses("no-ci-record-env")
def test_ci_history_capture_follows_the_env_alone(
    jobs: dict[str, harness.Job], outcomes: dict[str, ParseOutcome]
) -> None:
    assert harness.CI_RECORD_ENV in jobs["variant:default"].env
    outcome = outcomes["no-ci-record-env"]
    assert outcome.ok, _why(outcome)
    assert outcome.args is not None
    assert outcome.args["ci_enable_metrics_capture"] is False


@parses("no-cuda-device-max-connections")
def test_tensor_parallelism_needs_cuda_device_max_connections(
    outcomes: dict[str, ParseOutcome],
) -> None:
    outcome = outcomes["no-cuda-device-max-connections"]
    assert outcome.returncode == 1, _why(outcome)
    assert "CUDA_DEVICE_MAX_CONNECTIONS to 1" in outcome.message


@parses("wrong-checkpoint-config")
def test_the_checkpoint_config_is_cross_checked(outcomes: dict[str, ParseOutcome]) -> None:
    outcome = outcomes["wrong-checkpoint-config"]
    assert outcome.returncode == 1, _why(outcome)
    assert "num_hidden_layers in hf config 36 is not equal to num_layers 24" in outcome.message


@parses(*(f"variant:{case}" for case in harness.TRAIN_CASES), "unknown:--no-such-flag")
def test_a_forked_parse_reads_as_a_fresh_interpreters(
    checkout: MilesCheckout, jobs: dict[str, harness.Job], parse_run: harness.ParseRun
) -> None:
    """The batch's fork is the parse a fresh interpreter gives (``parse_batch.py``): for the
    accepted job that sets most keys beyond its batch's import env, and for a refusal."""
    accepted = sorted(n for n in parse_run.forked if parse_run.outcomes[n].ok)
    assert accepted and "unknown:--no-such-flag" in parse_run.forked, parse_run.forked
    most = max(accepted, key=lambda name: len(parse_run.forked[name]))
    names = (most, "unknown:--no-such-flag")
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        futures = {name: pool.submit(harness.parse_fresh, checkout, jobs[name]) for name in names}
        fresh = {name: future.result() for name, future in futures.items()}
    for name in names:
        forked = parse_run.outcomes[name]
        assert (forked.returncode, forked.message) == (fresh[name].returncode, fresh[name].message)
        assert forked.args == fresh[name].args, name
