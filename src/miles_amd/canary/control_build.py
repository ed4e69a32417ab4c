"""The positive control's builds and a rank's reducer: what a canary rank imports.

Decides the builds (:data:`BUILDS`): ``control`` (correct) and ``control-broken`` (end_sync's
wait removed: stage 2 may read a peer's tmp before that peer's stage 1, i.e. stale data), both
from ``control_kernel.cu`` compiled by torch's extension loader (nvcc; on ROCm torch hipifies
the same file), once per build in torch's extensions dir; and a rank's reducer
(:func:`reducer`): one buffer sized for the spec's largest input, the IPC handles exchanged
over the TP group's gloo group. torch is imported only inside the functions. The control's
run and record: ``canary.control``; ``docs/node.md`` ("The positive control").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

BUILDS = {"control": False, "control-broken": True}
KERNEL_SOURCE = Path(__file__).with_name("control_kernel.cu")


def load(implementation: str) -> Any:
    """The compiled extension of ``implementation``'s build (cached by torch per name)."""
    from torch.utils import cpp_extension

    broken = BUILDS[implementation]
    return cpp_extension.load(
        name="miles_amd_control_broken" if broken else "miles_amd_control",
        sources=[str(KERNEL_SOURCE)],
        extra_cuda_cflags=["-O3", *(["-DMILES_AMD_CONTROL_BROKEN"] if broken else [])],
        verbose=False,
    )


def reducer(implementation: str, spec: dict[str, Any], cpu_group: Any) -> Callable[[Any], Any]:
    """``implementation``'s all-reduce for this rank of ``cpu_group`` (module doc)."""
    import torch
    import torch.distributed as dist

    itemsize = torch.empty((), dtype=getattr(torch, spec["tensor_dtype"])).element_size()
    max_bytes = max(e["tokens"] for e in spec["entries"]) * spec["hidden"] * itemsize
    control = load(implementation).Control(
        dist.get_rank(cpu_group), dist.get_world_size(cpu_group), max_bytes
    )
    handles = [torch.empty_like(control.handle()) for _ in range(dist.get_world_size(cpu_group))]
    dist.all_gather(handles, control.handle(), group=cpu_group)
    control.open(handles)
    dist.barrier(group=cpu_group)
    return control.all_reduce
