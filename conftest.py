"""Root pytest configuration: the hardware options and the gating of the ``mi355x`` marker.

``mi355x`` tests run only with ``--runslow``; without it they are skipped with a reason that
says what they need. ``--runslow`` cannot pass off a node: it stops the session before
collection (exit 4, one line) when ``--aiter-variant`` is not given (there is no default: the
image decides which aiter the run has) or when the node is missing, naming each missing part:
the ROCm kernel driver's device ``/dev/kfd``, a ROCm torch, the recipe's GPUs. On a node with
a broken environment past those, the tests run and the preflight test fails with its table.

The node tests share the node and one run dir per variant, so they run one at a time: every
``mi355x`` test is in one xdist group (one worker, in order, whatever ``-n`` says). Without
xdist (``-p no:xdist``) the ``-n``/``--dist`` of ``pytest.ini`` are accepted and ignored.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from miles_amd.recipe import settings
from miles_amd.variants import AITER_VARIANTS

KFD_DEVICE = Path("/dev/kfd")
NODE_GROUP = "mi355x"  # the xdist group of every node test


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    if pluginmanager.is_blocked("xdist"):  # -p no:xdist: pytest.ini's -n and --dist do nothing
        parser.getgroup("xdist")._addoption("-n", "--numprocesses", help="ignored without xdist")
        parser.getgroup("xdist").addoption("--dist", help="ignored without xdist")
    group = parser.getgroup("miles_amd", "miles_amd hardware acceptance")
    group.addoption("--runslow", action="store_true", help="run the mi355x hardware tests")
    group.addoption(
        "--aiter-variant",
        choices=AITER_VARIANTS,
        default=None,
        help="the aiter build in this image (required with --runslow): stock, patched with "
        "ROCm/aiter#5694, or rccl (the control arm: SGLANG_USE_AITER_AR=0)",
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


def missing_node_parts(needed_gpus: int) -> list[str]:
    """What this machine lacks to be a node the recipe runs on; [] on a node."""
    missing = []
    if not KFD_DEVICE.exists():
        missing.append(str(KFD_DEVICE))
    gpus = 0
    try:
        torch = importlib.import_module("torch") if importlib.util.find_spec("torch") else None
    except Exception as exc:  # a broken install: named, not a traceback
        missing.append(f"ROCm torch (import torch failed: {type(exc).__name__})")
    else:
        if torch is None:
            missing.append("ROCm torch (not importable)")
        elif not getattr(torch.version, "hip", None):
            missing.append(f"ROCm torch ({torch.__version__}: no HIP)")
        elif torch.cuda.is_available():
            gpus = torch.cuda.device_count()
    if gpus < needed_gpus:
        missing.append(f"{needed_gpus} GPUs ({gpus} visible)")
    return missing


def pytest_configure(config: pytest.Config) -> None:
    """``--runslow`` off a node, or without a variant, stops here (module doc)."""
    if config.pluginmanager.is_blocked("xdist"):
        config.addinivalue_line("markers", "xdist_group(name): an xdist group (ignored here)")
    # the controller decides for the run; an xdist worker (workerinput) does not probe again
    if not config.getoption("--runslow") or hasattr(config, "workerinput"):
        return
    if config.getoption("--aiter-variant") is None:
        raise pytest.UsageError(
            f"--runslow needs --aiter-variant {'|'.join(AITER_VARIANTS)}: the aiter this image "
            "has (no default)"
        )
    missing = missing_node_parts(settings.Recipe.num_gpus)
    if missing:
        raise pytest.UsageError(f"--runslow off a node: missing {', '.join(missing)}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    node_tests = [item for item in items if "mi355x" in item.keywords]
    for item in node_tests:
        item.add_marker(pytest.mark.xdist_group(NODE_GROUP))
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="needs --runslow and an 8x MI355X node (ROCm, /dev/kfd)")
    for item in node_tests:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_history(tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> None:
    """Every test's `miles-amd gate` appends to a history of its own, never the user's."""
    path = tmp_path_factory.mktemp("history") / "history.sqlite"
    monkeypatch.setenv("MILES_AMD_HISTORY", str(path))
