"""Fixtures of the conformance tier: the checkout under test, the planned jobs, their parses.

The parses the selected tests name (:func:`parses`) run at once, the first time a test asks
(``parse_run``), so ``-k default`` costs one parse; the parser tests share one xdist group.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import pytest

from tests.conformance import harness
from tests.conformance.fake_inputs import MODEL_SUBDIR, make_fake_inputs

# Tokens real miles does not know; the first is the flag miles-amd used to add (miles turns
# CI-history capture on from MILES_CI_GATE_RECORD_DIR alone).
UNKNOWN_FLAGS = ("--ci-enable-metrics-capture", "--no-such-flag")
F = TypeVar("F", bound=Callable[..., object])


def parses(*job_names: str) -> Callable[[F], F]:
    """Name the jobs a test reads from ``parse_run``; ``{param}`` is the test's parameter."""

    def mark(test: F) -> F:
        test.parses = job_names  # type: ignore[attr-defined]
        return test

    return mark


def _jobs_of(item: pytest.Item) -> set[str]:
    names = getattr(getattr(item, "function", None), "parses", ())
    callspec = getattr(item, "callspec", None)
    return {name.format(**(callspec.params if callspec else {})) for name in names}


@pytest.fixture(scope="session")
def checkout(request: pytest.FixtureRequest) -> harness.MilesCheckout:
    return harness.resolve(request.config)


@pytest.fixture(scope="session")
def jobs(
    checkout: harness.MilesCheckout, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, harness.Job]:
    """Every job the tier parses, by name: ``variant:<snapshot case>``, then the controls."""
    runs = tmp_path_factory.mktemp("runs")
    inputs = make_fake_inputs(tmp_path_factory.mktemp("inputs"))

    def plan(name: str, cli: list[str], env: dict[str, str], on=inputs) -> harness.Job:
        return harness.plan_with_cli(checkout, on, runs / name.replace(":", "-"), cli, env)

    out = {f"variant:{c}": plan(c, f, e) for c, (f, e) in sorted(harness.TRAIN_CASES.items())}
    for token in UNKNOWN_FLAGS:
        out[f"unknown:{token}"] = plan(f"unknown{token}", [f"--extra-args={token}"], {})
    default = out["variant:default"]
    out["no-ci-record-env"] = default.with_env(**{harness.CI_RECORD_ENV: None})
    out["no-cuda-device-max-connections"] = default.with_env(CUDA_DEVICE_MAX_CONNECTIONS=None)
    # a config.json that disagrees with the recipe's --num-layers 24
    wrong = make_fake_inputs(tmp_path_factory.mktemp("wrong-inputs"))
    config = wrong[0] / MODEL_SUBDIR / "config.json"
    layers = {"num_hidden_layers": 36, "layer_types": ["full_attention"] * 36}
    config.write_text(json.dumps({**json.loads(config.read_text()), **layers}))
    out["wrong-checkpoint-config"] = plan("wrong-checkpoint", [], {}, on=wrong)
    return out


@pytest.fixture(scope="session")
def parse_run(
    request: pytest.FixtureRequest, checkout: harness.MilesCheckout, jobs: dict[str, harness.Job]
) -> harness.ParseRun:
    wanted = set().union(*(_jobs_of(item) for item in request.session.items))
    return harness.parse_all(checkout, {name: jobs[name] for name in sorted(wanted)})
