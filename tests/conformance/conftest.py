"""Fixtures of the conformance tier: the checkout under test, the planned jobs, their parses.

The parses the selected tests need (each test names them with :func:`parses`) run at once,
the first time a test asks for one (``outcomes``): the jobs that share an import path in one
batch that imports miles once and forks a child per job (about 6 CPU-s for the import, then
3 per parse), the others in a fresh interpreter each (about 13 CPU-s), so ``-k default``
costs one parse. Under xdist (``pytest.ini``'s ``-n auto``) every parser test is in the xdist group
``miles-parse``, so one worker runs them and each parse runs once.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from miles_amd.recipe.ignored_flags import BY_FLAG
from miles_amd.recipe.lora_targets import LORA_TARGET_MODULES
from miles_amd.run.probes_miles import ParseOutcome
from tests.conformance import harness
from tests.conformance.checkout import MilesCheckout, resolve
from tests.conformance.fake_inputs import MODEL_SUBDIR, make_fake_inputs

# Negative controls: tokens real miles does not know. The first is the flag miles-amd used to
# add (miles turns CI-history capture on from MILES_CI_GATE_RECORD_DIR alone).
UNKNOWN_FLAGS = ("--ci-enable-metrics-capture", "--no-such-flag")

F = TypeVar("F", bound=Callable[..., object])
SEMANTIC_PROBE = Path(__file__).resolve().parent / "semantic_probe.py"
GPU_STUBS = Path(__file__).resolve().parents[2] / "src" / "miles_amd" / "node" / "miles_parse.py"
IGNORED = set(BY_FLAG)
# Names the probe maps one by one: the recipe's allowed table and gpt-oss's own expert name.
LORA_NAMES = (*LORA_TARGET_MODULES, "gate_up_proj")


def parses(*job_names: str) -> Callable[[F], F]:
    """Name the jobs a test reads from ``outcomes``; ``{param}`` is the test's parameter."""

    def mark(test: F) -> F:
        test.parses = job_names  # type: ignore[attr-defined]
        return test

    return mark


def _jobs_of(item: pytest.Item) -> set[str]:
    names = getattr(getattr(item, "function", None), "parses", ())
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec else {}
    return {name.format(**params) for name in names}


@pytest.fixture(scope="session")
def checkout(request: pytest.FixtureRequest) -> MilesCheckout:
    return resolve(request.config)


@pytest.fixture(scope="session")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_fake_inputs(tmp_path_factory.mktemp("inputs"))


def _wrong_checkpoint_inputs(root: Path) -> tuple[Path, Path]:
    """Fake inputs whose config.json disagrees with the recipe's --num-layers 24."""
    model_dir, data_dir = make_fake_inputs(root)
    config = model_dir / MODEL_SUBDIR / "config.json"
    wrong = json.loads(config.read_text())
    wrong.update(num_hidden_layers=36, layer_types=["full_attention"] * 36)
    config.write_text(json.dumps(wrong))
    return model_dir, data_dir


@pytest.fixture(scope="session")
def jobs(
    checkout: MilesCheckout, inputs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, harness.Job]:
    """Every job the tier parses, by name: ``variant:<snapshot case>``, then the controls."""
    runs = tmp_path_factory.mktemp("runs")

    def plan(name: str, cli: list[str], env: dict[str, str], on=inputs) -> harness.Job:
        return harness.plan_with_cli(checkout, on, runs / name.replace(":", "-"), cli, env)

    out: dict[str, harness.Job] = {}
    for case, (flags, env) in sorted(harness.TRAIN_CASES.items()):
        out[f"variant:{case}"] = plan(case, flags, env)  # the real PATH is kept
    for token in UNKNOWN_FLAGS:
        out[f"unknown:{token}"] = plan(f"unknown{token}", [f"--extra-args={token}"], {})
    default = out["variant:default"]
    out["no-ci-record-env"] = default.with_env(**{harness.CI_RECORD_ENV: None})
    out["no-cuda-device-max-connections"] = default.with_env(CUDA_DEVICE_MAX_CONNECTIONS=None)
    wrong = _wrong_checkpoint_inputs(tmp_path_factory.mktemp("wrong-inputs"))
    out["wrong-checkpoint-config"] = plan("wrong-checkpoint", [], {}, on=wrong)
    return out


@pytest.fixture(scope="session")
def parse_run(
    request: pytest.FixtureRequest, checkout: MilesCheckout, jobs: dict[str, harness.Job]
) -> harness.ParseRun:
    """The parses of the jobs the selected tests name, all run at once."""
    wanted = set().union(*(_jobs_of(item) for item in request.session.items))
    return harness.parse_all(checkout, {name: jobs[name] for name in sorted(wanted)})


@pytest.fixture(scope="session")
def outcomes(parse_run: harness.ParseRun) -> dict[str, ParseOutcome]:
    return parse_run.outcomes


@pytest.fixture(scope="session")
def semantics(
    checkout: MilesCheckout, jobs: dict[str, harness.Job], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """``semantic_probe.py`` on the default job: what miles' own code makes of its argv."""
    job = jobs["variant:default"]
    result = tmp_path_factory.mktemp("semantics") / "result.json"
    flags = sorted({token for token in job.train_argv if token.startswith("--")} | IGNORED)
    command = [
        str(checkout.python), str(SEMANTIC_PROBE), "--result", str(result),
        "--stubs", str(GPU_STUBS), "--lora-names", ",".join(LORA_NAMES),
        f"--recipe-flags={','.join(flags)}", "--", *job.train_argv,
    ]  # fmt: skip
    done = subprocess.run(command, env=job.env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and result.is_file(), done.stderr[-4000:]
    probed: dict[str, Any] = json.loads(result.read_text())
    return probed
