"""One rank of the canary: all-reduce known integers over the plan and check every bit.

- Run by ``canary.launch`` as ``python -m miles_amd.canary.worker SPEC RANK``; writes
  ``rank<R>.json`` beside ``SPEC`` (its results, or ``{"error": ..., "at": <epoch s>}``) and
  exits 0, or 3 on an error.
- Rendezvous: rank 0's ``TCPStore`` on 127.0.0.1 port 0 (aiter's IPC exchange requires a TCP
  store), its port written beside the spec; per TP group a device group and a gloo group.
- Inputs: ``a(r, i) + b(c)``, integers whose every partial sum has magnitude at most 248, so
  exact in bf16 and fp32 in any order of addition; consecutive calls differ at every element.
- Checking on the device: a block of calls back to back, then one bitwise comparison against
  the exact sums, max-reduced over the TP group (``mismatches`` counts calls wrong on any
  rank); the first wrong element is kept. Latency: a block's wall time over its calls.
- Reducers: ``reducer`` (``FILE:FUNCTION``, the test seam), ``rccl``
  (``torch.distributed.all_reduce``), ``aiter`` and ``sglang`` (``CustomAllreduce`` built as
  SGLang's ``GroupCoordinator`` does), ``control`` and ``control-broken`` (``canary.control``).

Caveats:

- A disabled communicator or a declined size is an error, not a skip.
- Eager calls only: the CUDA-graph registered-input path is not exercised.

Explained in ``docs/node.md`` ("How a rank checks": the input formula, blocks, sources).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

A_MOD, A_OFFSET, PHASES, B_OFFSET = 15, 7, 49, 24
MAX_BLOCK = 4096
COMM_MODULES = {
    "aiter": "aiter.dist.device_communicators.custom_all_reduce",
    "sglang": "sglang.srt.distributed.device_communicators.custom_all_reduce",
}
PORT_FILE = "port"


def a_value(rank: int, index: int) -> int:
    """``a(r, i)`` of the module doc."""
    return (5 * index + 3 * rank) % A_MOD - A_OFFSET


def b_value(call: int) -> int:
    """``b(c)`` of the module doc."""
    return call % PHASES - B_OFFSET


def result_path(spec_path: Path, rank: int) -> Path:
    return spec_path.parent / f"rank{rank}.json"


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def load_reducer(target: str) -> Callable[[Any, Any], Any]:
    """``FILE:FUNCTION`` loaded from its file (the seam); ValueError when it cannot be."""
    file_name, _, func_name = target.rpartition(":")
    path = Path(file_name)
    spec = importlib.util.spec_from_file_location(f"_canary_reducer_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{file_name}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"{file_name} defines no function {func_name}")
    return func


def _store(spec: dict[str, Any], spec_path: Path, rank: int, timeout: timedelta) -> Any:
    import torch.distributed as dist

    port_file = spec_path.parent / PORT_FILE
    world = spec["world_size"]
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout, wait_for_workers=False)
        _write(port_file, {"port": store.port})
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while not port_file.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 published no store port within {timeout}")
        time.sleep(0.02)
    port = json.loads(port_file.read_text(encoding="utf-8"))["port"]
    return dist.TCPStore("127.0.0.1", port, world, False, timeout)


def _reducer(
    spec: dict[str, Any], device: Any, dev_group: Any, cpu_group: Any
) -> Callable[[Any], Any]:
    import torch.distributed as dist

    kind = spec["implementation"]
    if kind == "reducer":
        func = load_reducer(spec["reducer"])
        return lambda t: func(t, dev_group)
    if kind == "rccl":

        def rccl(t: Any) -> Any:
            dist.all_reduce(t, group=dev_group)
            return t

        return rccl
    if kind.startswith("control"):
        from miles_amd.canary import control

        return control.reducer(kind, spec, cpu_group)
    comm = importlib.import_module(COMM_MODULES[kind]).CustomAllreduce(cpu_group, device)
    if comm.disabled:
        raise RuntimeError(f"{kind}'s CustomAllreduce is disabled on this TP group")

    def custom(t: Any) -> Any:
        out = comm.custom_all_reduce(t)
        if out is None:
            raise RuntimeError(
                f"{kind}'s CustomAllreduce declined {t.numel() * t.element_size()} bytes"
            )
        return out

    return custom


def run(spec: dict[str, Any], spec_path: Path, rank: int) -> dict[str, Any]:
    """This rank's share of the plan (module doc); raises on any failure."""
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=spec["timeout_s"])
    tp, world = spec["tp"], spec["world_size"]
    on_gpu = spec["device"] == "cuda"
    if on_gpu:
        local = rank % torch.cuda.device_count()
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    store = _store(spec, spec_path, rank, timeout)
    dist.init_process_group(
        spec["backend"], store=store, rank=rank, world_size=world, timeout=timeout
    )
    group = rank // tp
    dev_groups, cpu_groups = [], []
    for g in range(world // tp):
        ranks = list(range(g * tp, (g + 1) * tp))
        dev_groups.append(dist.new_group(ranks, backend=spec["backend"]))
        cpu_groups.append(dist.new_group(ranks, backend="gloo"))
    world_cpu = dist.new_group(list(range(world)), backend="gloo")
    dev_group, cpu_group = dev_groups[group], cpu_groups[group]
    reduce = _reducer(spec, device, dev_group, cpu_group)
    dtype = getattr(torch, spec["tensor_dtype"])
    bits = torch.int16 if dtype.itemsize == 2 else torch.int32
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    r = rank % tp
    entries = []
    for entry in spec["entries"]:
        tokens, calls = entry["tokens"], entry["calls"]
        shape = (tokens, spec["hidden"])
        index = torch.arange(tokens * spec["hidden"], device=device, dtype=torch.int64).view(shape)
        a = ((5 * index + 3 * r) % A_MOD - A_OFFSET).to(dtype)
        sum_a = torch.stack([(5 * index + 3 * k) % A_MOD - A_OFFSET for k in range(tp)]).sum(0)
        sum_a = sum_a.to(torch.float32)
        tensor_bytes = a.numel() * a.element_size()
        block = max(1, min(MAX_BLOCK, spec["mem_budget"] // (4 * tensor_bytes)))
        entries.append(
            _run_entry(spec, reduce, sync, a, sum_a, tp, bits, block, calls, cpu_group, dist)
            | {"tokens": tokens}
        )
    sync()
    dist.barrier(group=world_cpu)
    dist.destroy_process_group()
    return {"rank": rank, "group": group, "entries": entries}


def _run_entry(
    spec: dict[str, Any],
    reduce: Callable[[Any], Any],
    sync: Callable[[], None],
    a: Any,
    sum_a: Any,
    tp: int,
    bits: Any,
    block: int,
    calls: int,
    cpu_group: Any,
    dist: Any,
) -> dict[str, Any]:
    import torch

    seconds, wrong, per_repeat = 0.0, 0, []
    first: dict[str, Any] | None = None
    for repeat in range(spec["repeats"]):
        bad_calls = 0
        for start in range(0, calls, block):
            count = min(block, calls - start)
            phases = [b_value(c) for c in range(start, start + count)]
            outs = []
            sync()
            began = time.perf_counter()
            for b in phases:
                outs.append(reduce(a + b))
            sync()
            seconds += time.perf_counter() - began
            expected = (
                sum_a
                + tp * torch.tensor(phases, dtype=torch.float32, device=a.device).view(-1, 1, 1)
            ).to(a.dtype)
            ne = torch.stack(outs).view(bits) != expected.view(bits)
            flags = ne.flatten(1).any(dim=1)
            wrong += int(ne.sum().item())
            local = flags.to(torch.int32).cpu()
            if first is None and bool(local.any()):
                j = int(local.nonzero()[0])
                k = int(ne[j].flatten().nonzero()[0])
                first = {
                    "repeat": repeat,
                    "call": start + j,
                    "index": k,
                    "expected": float(expected[j].flatten()[k]),
                    "seen": float(outs[j].flatten()[k]),
                }
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=cpu_group)
            bad_calls += int(local.sum())
        per_repeat.append(bad_calls)
    return {
        "calls": calls * spec["repeats"],
        "seconds": seconds,
        "wrong_elements": wrong,
        "mismatches_per_repeat": per_repeat,
        "first": first,
    }


def main(argv: list[str]) -> int:
    spec_path, rank = Path(argv[0]), int(argv[1])
    out = result_path(spec_path, rank)
    try:
        spec = json.loads(spec_path.read_text(encoding="utf-8"))
        _write(out, run(spec, spec_path, rank))
    except BaseException as exc:  # the launcher names it; any failure is this rank's error
        _write(out, {"error": f"{type(exc).__name__}: {exc}".strip()[:500], "at": time.time()})
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
