"""The positive control (``canary.harness.run_control``, ``canary.worker``'s builds): its plan,
fingerprint and record on CPU, its kernel source ready for hipify, and both builds on a CUDA GPU
(skipped without one).

The record comes from the real CPU harness (4 gloo processes) with a reducer that returns the
previous call's sum, the fault class the broken build makes; a clean one with gloo's own."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.canary import harness, worker
from miles_amd.canary.harness import Setup, run
from miles_amd.canary.plan import CPU, build_plan, recipe_shape
from miles_amd.recipe.settings import Recipe
from miles_amd.records.canary import ControlRecord, Mismatch
from miles_amd.records.model import parse

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch: pip install torch==2.13.0")

STALE = """
import torch.distributed as dist

_previous = {}


def stale(tensor, group):
    dist.all_reduce(tensor, group=group)
    out = _previous.get(tensor.shape, tensor)
    _previous[tensor.shape] = tensor.clone()
    return out
"""
GLOO = """
import torch.distributed as dist


def gloo(tensor, group):
    dist.all_reduce(tensor, group=group)
    return tensor
"""


def _node_plan():  # the recipe's plan as the node builds it
    return build_plan(recipe_shape(Recipe()), "aiter", 1e-6)


def test_control_plan_keeps_the_suspect_sizes_back_to_back_and_capped() -> None:
    plan = _node_plan()
    got = harness.control_plan(plan, calls=7)
    suspect = [e.tokens for e in plan.entries if e.affected or e.exposed]
    assert [e.tokens for e in got.entries] == suspect
    assert len(suspect) < len(plan.entries)  # decode sizes and uniform controls left out
    assert all(e.arms == ((harness.CONTROL_ARM, 7),) for e in got.entries)
    assert {e.implementation for e in got.entries} == {"control-broken"}


def test_fingerprint_places_the_element_in_the_control_kernels_layout() -> None:
    # N = 128 at hidden 2880, bf16, TP 4: 46,080 packs of 8, segments of 11,520, 128 lanes a
    # slot, 80 blocks. Pack 2 * 11520 + 128 * 81 + 5 is rank 2's, block 81 mod 80 = 1, lane 5.
    pack = 2 * 11520 + 128 * 81 + 5
    first = Mismatch(0, 3, "back_to_back", 4, 8 * pack + 3, -106.0, -94.0, None, False)
    text = harness.control_fingerprint(first, 128, 2880, 4, 2)
    assert text == (
        "N=128 call 3: rank 0 read rank 2's segment (a peer), block 1 lane 5; "
        "expected -106, seen -94: -12 rank input step(s), -3 of the sum's"
    )
    other = dataclasses.replace(first, index=None, expected=None, seen=None, returned="f32 [1]")
    assert harness.control_fingerprint(other, 128, 2880, 4, 2) == "N=128 call 3: returned f32 [1]"


def test_the_harness_imports_no_torch() -> None:
    code = "import sys, miles_amd.canary.harness as h, miles_amd.canary.worker as w; "
    code += "print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_kernel_source_is_plain_cuda_runtime_for_hipify() -> None:
    text = worker.KERNEL_SOURCE.read_text(encoding="utf-8")
    code = re.sub(r"//[^\n]*", "", text)
    assert not re.search(r"\basm\b|cuda_bf16|cuda_fp16|__shfl|cooperative_groups", code)
    for call in ("cudaIpcGetMemHandle", "cudaIpcOpenMemHandle", "cudaIpcCloseMemHandle"):
        assert call in code
    assert code.count("#ifdef MILES_AMD_CONTROL_BROKEN") == 1  # the one switch of the builds
    assert "if (!broken)" in code  # ... which only drops end_sync's wait


@needs_torch
def test_hipify_turns_the_kernel_into_hip(tmp_path: Path) -> None:
    from torch.utils.hipify import hipify_python

    source = tmp_path / worker.KERNEL_SOURCE.name
    source.write_text(worker.KERNEL_SOURCE.read_text(encoding="utf-8"), encoding="utf-8")
    hipify_python.hipify(
        project_directory=str(tmp_path),
        output_directory=str(tmp_path),
        includes=[str(tmp_path / "*")],
        is_pytorch_extension=True,
        show_progress=False,
    )
    hip = re.sub(r"//[^\n]*", "", source.with_suffix(".hip").read_text(encoding="utf-8"))
    assert "hipIpcOpenMemHandle" in hip and "hipLaunchKernelGGL" in hip
    assert not re.search(r"\bcuda[A-Z]\w*", hip)  # no CUDA runtime call left


def _cpu_record(tmp_path: Path, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    plan = build_plan(recipe_shape(Recipe()), "reducer", 0.5, target=CPU, tokens=(32, 127))
    plan = dataclasses.replace(
        plan,
        entries=tuple(
            dataclasses.replace(e, arms=((harness.CONTROL_ARM, 6),)) for e in plan.entries
        ),
    )
    return run(plan, Setup(4, "cpu", "reducer", reducer=f"{path}:{name}"), timeout_s=300)


@needs_torch
def test_control_result_reads_a_caught_run_and_a_clean_one(tmp_path: Path) -> None:
    caught = harness.control_result(_cpu_record(tmp_path, "stale", STALE), 2880, 4, 4)
    assert caught.caught and caught.calls == 12
    assert caught.mismatched_calls == 10  # every call but each size's first
    assert caught.fingerprint is not None and caught.fingerprint.startswith("N=32 call 1: ")
    assert "1 of the sum's" in caught.fingerprint  # the previous call's sum: one step of it
    assert parse(ControlRecord, dataclasses.asdict(caught)) == caught
    clean = harness.control_result(_cpu_record(tmp_path, "gloo", GLOO), 2880, 4, 4)
    assert (clean.caught, clean.mismatched_calls, clean.fingerprint) == (False, 0, None)


def _cuda() -> bool:
    if not HAS_TORCH:
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(
    not _cuda(),
    reason="the control's CUDA path runs on a GPU machine only (docs/node.md, 'What a GPU run "
    "showed'); CPU CI keeps the gloo harness",
)
def test_both_builds_on_cuda_broken_caught_correct_clean() -> None:
    import torch

    share = torch.cuda.device_count() < 4
    plan = harness.control_plan(_node_plan(), calls=50)
    plan = dataclasses.replace(plan, entries=plan.entries[:3])
    for build in ("control-broken", "control"):
        setup = Setup(4, "cuda", build, collective="gloo" if share else None)
        record = run(plan, setup, timeout_s=600)
        result = harness.control_result(record, 2880, 4, 2)
        assert result.caught == (build == "control-broken"), result
