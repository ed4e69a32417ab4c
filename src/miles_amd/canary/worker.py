"""One rank of the canary, run as ``python -m miles_amd.canary.worker SPEC RANK``: all-reduce
known integers over the plan's tasks and check every bit; writes ``rank<R>.json`` beside
``SPEC`` and exits 0, or 3 on an error. torch is imported only inside functions.
``docs/node.md`` ("How a rank checks", "The positive control").
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
CONTROL_BUILDS = {"control": False, "control-broken": True}
KERNEL_SOURCE = Path(__file__).with_name("control_kernel.cu")


def a_value(rank: int, index: Any) -> Any:
    """A rank's input ``a(r, i)`` (``docs/node.md``, "How a rank checks")."""
    return (5 * index + 3 * rank) % A_MOD - A_OFFSET


def result_path(spec_path: Path, rank: int) -> Path:
    return spec_path.parent / f"rank{rank}.json"


def _write(path: Path, data: dict[str, Any]) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(data), encoding="utf-8")
    os.replace(path.with_suffix(".tmp"), path)


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
    if kind == "reducer":  # FILE:FUNCTION, the CPU seam
        file_name, _, func_name = spec["reducer"].rpartition(":")
        where = importlib.util.spec_from_file_location("_canary_reducer", file_name)
        if where is None or where.loader is None:
            raise ValueError(f"{file_name}: not a Python file")
        module = importlib.util.module_from_spec(where)
        where.loader.exec_module(module)
        func = getattr(module, func_name, None)
        if not callable(func):
            raise ValueError(f"{file_name} defines no function {func_name}")
        return lambda t: func(t, dev_group)
    if kind == "rccl":

        def rccl(t: Any) -> Any:
            dist.all_reduce(t, group=dev_group)
            return t

        return rccl
    if kind.startswith("control"):
        return control_reducer(kind, spec, cpu_group)
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
    """This rank's share of the plan; raises on any failure."""
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
    rank_state = _Rank(spec, rank % tp, device, cpu_group, on_gpu)
    results = [
        {
            "tokens": entry["tokens"],
            "wrong_elements": 0,
            "mismatches_per_repeat": [0] * spec["repeats"],
            "kept": [],
            "arms": {},
            "next_call": 0,
        }
        for entry in spec["entries"]
    ]
    for repeat in range(spec["repeats"]):
        for task in spec["tasks"]:
            rank_state.run_task(reduce, task, repeat, results[task["entry"]])
    rank_state.sync()
    dist.barrier(group=world_cpu)
    dist.destroy_process_group()
    return {"rank": rank, "group": group, "entries": results}


class _Rank:
    """One rank's inputs per size, its arms' extra work and its checker."""

    def __init__(self, spec: dict[str, Any], r: int, device: Any, cpu_group: Any, gpu: bool):
        import torch

        self.spec, self.r, self.device, self.cpu_group, self.gpu = spec, r, device, cpu_group, gpu
        self.dtype = getattr(torch, spec["tensor_dtype"])
        self.bits = torch.int16 if self.dtype.itemsize == 2 else torch.int32
        self.sync = torch.cuda.synchronize if gpu else (lambda: None)
        self.inputs: dict[int, tuple[Any, Any]] = {}
        width = spec["gemm_width"]
        self.weight = torch.ones((spec["hidden"], width), dtype=self.dtype, device=device) / width

    def base(self, tokens: int) -> tuple[Any, Any]:
        """``a(r, i)`` of this rank and ``sum_r a(r, i)``, one size at a time in memory."""
        import torch

        if tokens not in self.inputs:
            tp, hidden = self.spec["tp"], self.spec["hidden"]
            index = torch.arange(tokens * hidden, device=self.device).view(tokens, hidden)
            a = a_value(self.r, index).to(self.dtype)
            sum_a = torch.zeros((tokens, hidden), dtype=torch.float32, device=self.device)
            for k in range(tp):
                sum_a += a_value(k, index)
            self.inputs = {tokens: (a, sum_a)}
        return self.inputs[tokens]

    def before_call(self, arm: str, call: int, x: Any) -> None:
        import torch

        if arm == "gemm":
            torch.matmul(x, self.weight)
        elif arm == "skew" and call % self.spec["tp"] == self.r:
            if self.gpu:
                torch.cuda._sleep(int(self.spec["skew_s"] * 2e9))
            else:
                time.sleep(self.spec["skew_s"])

    def run_task(
        self, reduce: Callable[[Any], Any], task: dict[str, Any], repeat: int, out: dict[str, Any]
    ) -> None:
        import torch
        import torch.distributed as dist

        a, sum_a = self.base(out["tokens"])
        tensor_bytes = a.numel() * a.element_size()
        block = max(1, min(MAX_BLOCK, self.spec["mem_budget"] // (4 * tensor_bytes)))
        arm = out["arms"].setdefault(
            task["arm"],
            {"calls": 0, "seconds": 0.0, "wall": 0.0, "blocks": 0, "block_hits": 0, "bad": 0},
        )
        tp = self.spec["tp"]
        for start in range(0, task["calls"], block):
            count = min(block, task["calls"] - start)
            block_began = time.perf_counter()
            first = out["next_call"]
            out["next_call"] += count
            phases = torch.tensor(
                [float(c % PHASES - B_OFFSET) for c in range(first, first + count)],
                device=self.device,
            ).view(-1, 1, 1)
            inputs = (a.unsqueeze(0) + phases.to(self.dtype)).to(self.dtype)
            expected = (sum_a.unsqueeze(0) + tp * phases).to(self.dtype)
            outs = []
            self.sync()
            began = time.perf_counter()
            for j in range(count):
                self.before_call(task["arm"], first + j, inputs[j])
                outs.append(reduce(inputs[j]))
            self.sync()
            arm["seconds"] += time.perf_counter() - began
            flags = self._check(outs, inputs, expected, a, first, repeat, task["arm"], out)
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.cpu_group)
            bad = int(flags.sum())
            arm["wall"] += time.perf_counter() - block_began
            arm["calls"] += count
            arm["blocks"] += 1
            arm["block_hits"] += 1 if bad else 0
            arm["bad"] += bad
            out["mismatches_per_repeat"][repeat] += bad

    def _check(
        self,
        outs: list[Any],
        inputs: Any,
        expected: Any,
        a: Any,
        first: int,
        repeat: int,
        arm: str,
        out: dict[str, Any],
    ) -> Any:
        """Per-call flags (int32, CPU) of the block; shape and dtype compared before values."""
        import torch

        keep = self.spec["keep"]

        def kept(call: int, index: Any, expected: Any, seen: Any, returned: Any) -> None:
            found = {"index": index, "expected": expected, "seen": seen, "returned": returned}
            out["kept"].append({"repeat": repeat, "call": call, "arm": arm, **found})

        foreign = [
            j for j, o in enumerate(outs) if tuple(o.shape) != tuple(a.shape) or o.dtype != a.dtype
        ]
        for j in foreign:
            out["wrong_elements"] += a.numel()
            if len(out["kept"]) < keep:
                got = outs[j]
                returned = (
                    f"shape {list(got.shape)} {got.dtype}, expected {list(a.shape)} {a.dtype}"
                )
                kept(first + j, None, None, None, returned)
            outs[j] = expected[j]
        in_place = all(o.data_ptr() == inputs[j].data_ptr() for j, o in enumerate(outs))
        got = inputs if in_place else torch.stack(outs)  # in-place reducers: no copy
        ne = got.view(self.bits) != expected.view(self.bits)
        flags = ne.flatten(1).any(dim=1).to(torch.int32).cpu()  # the block's one host sync
        bad = flags.nonzero().flatten().tolist()
        for j in foreign:
            flags[j] = 1
        out["wrong_elements"] += sum(int(ne[j].sum()) for j in bad)
        for j in bad:
            if len(out["kept"]) >= keep:
                break
            got = outs[j].flatten()
            for k in ne[j].flatten().nonzero().flatten()[: keep - len(out["kept"])].tolist():
                kept(first + j, k, float(expected[j].flatten()[k]), float(got[k]), None)
        return flags


def control_reducer(
    implementation: str, spec: dict[str, Any], cpu_group: Any
) -> Callable[[Any], Any]:
    """The control build's all-reduce: compiled (cached by torch), IPC handles exchanged."""
    import torch
    import torch.distributed as dist
    from torch.utils import cpp_extension

    broken = CONTROL_BUILDS[implementation]
    extension = cpp_extension.load(
        name="miles_amd_control_broken" if broken else "miles_amd_control",
        sources=[str(KERNEL_SOURCE)],
        extra_cuda_cflags=["-O3", *(["-DMILES_AMD_CONTROL_BROKEN"] if broken else [])],
        verbose=False,
    )
    itemsize = torch.empty((), dtype=getattr(torch, spec["tensor_dtype"])).element_size()
    max_bytes = max(e["tokens"] for e in spec["entries"]) * spec["hidden"] * itemsize
    control = extension.Control(dist.get_rank(cpu_group), dist.get_world_size(cpu_group), max_bytes)
    handles = [torch.empty_like(control.handle()) for _ in range(dist.get_world_size(cpu_group))]
    dist.all_gather(handles, control.handle(), group=cpu_group)
    control.open(handles)
    dist.barrier(group=cpu_group)
    return control.all_reduce


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
