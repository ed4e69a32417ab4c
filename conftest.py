"""Root pytest configuration: the hardware options and the gating of the ``mi355x`` marker.

``mi355x`` tests run only with ``--runslow`` on a machine where the ROCm kernel driver's
device ``/dev/kfd`` exists (an AMD GPU node, or a container started with
``--device=/dev/kfd``). Everywhere else they are skipped with a reason that says what they
need. On a node that has the device but a broken environment they run, and the preflight
test fails with its table instead of skipping.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_amd.recipe import settings
from miles_amd.variants import AITER_VARIANTS

KFD_DEVICE = Path("/dev/kfd")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("miles_amd", "miles_amd hardware acceptance")
    group.addoption("--runslow", action="store_true", help="run the mi355x hardware tests")
    group.addoption(
        "--aiter-variant",
        choices=AITER_VARIANTS,
        default="patched",
        help="the aiter build in this image: stock, patched with ROCm/aiter#5694, or rccl "
        "(the control arm: SGLANG_USE_AITER_AR=0)",
    )
    group.addoption(
        "--model-dir", default=settings.DEFAULT_MODEL_DIR, help="holds gpt-oss-20b-bf16/"
    )
    group.addoption("--data-dir", default=settings.DEFAULT_DATA_DIR, help="holds dapo-math-17k/")
    group.addoption("--miles-dir", default=settings.DEFAULT_MILES_DIR, help="miles checkout")
    group.addoption(
        "--megatron-dir", default=settings.DEFAULT_MEGATRON_DIR, help="Megatron-LM checkout"
    )
    group.addoption(
        "--run-root", default="runs/mi355x", help="run dirs go to <run-root>/<aiter variant>/"
    )
    group.addoption("--num-rollouts", type=int, default=20, help="rollouts of the hardware run")


def amd_gpu_present() -> bool:
    return KFD_DEVICE.exists()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--runslow"):
        reason = "needs --runslow and an 8x MI355X node (ROCm, /dev/kfd)"
    elif not amd_gpu_present():
        reason = f"needs an AMD GPU node: {KFD_DEVICE} not found (no ROCm kernel driver here)"
    else:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "mi355x" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_history(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    """Every test's `miles-amd gate` appends to a history of its own, never the user's."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    monkeypatch.setenv("MILES_AMD_HISTORY", str(path))
