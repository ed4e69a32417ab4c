"""A canary run end to end: whether this machine can run the hardware canary (probed in a
child, each reason one line naming the fix); the ranks (``canary.worker``) as bounded processes
in their own sessions, stopped also on SIGTERM/SIGHUP, the first failure named; their results
merged per size and arm with the stale-read fingerprint; the positive control's run;
``canary.json`` written whole. ``docs/node.md`` ("The all-reduce canary", "The positive
control").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_amd.canary.kernel import PACK_BYTES, Layout, matches
from miles_amd.canary.plan import (
    CONFIDENCE,
    SKEW_S,
    Plan,
    control_plan,
    detection_probability,
    rate_upper_bound,
)
from miles_amd.canary.worker import result_path
from miles_amd.files import atomic_write_text
from miles_amd.records.canary import (
    SCHEMA_VERSION,
    ArmResult,
    CanaryRecord,
    ControlRecord,
    Mismatch,
    PowerRecord,
    SizeResult,
    fingerprint_of,
)
from miles_amd.run_dir import RunDir

GRACE_S = 3.0
POLL_S = 0.05
SRC_DIR = Path(__file__).resolve().parents[2]
KEEP = 16
SPREAD_SLICES = 8
CONTROL_THREADS, CONTROL_MAX_BLOCKS = 512, 80  # control_kernel.cu's kThreads, kMaxBlocks
NOT_SEEN = "the canary could not see this class of race here"
# what differs between the ranks on a GPU and on the CPU harness
GPU_SPEC = {"mem_budget": 1 << 30, "skew_s": SKEW_S}
CPU_SPEC = {"mem_budget": 64 << 20, "skew_s": 1e-3, "gemm_width": 16}


class HarnessError(RuntimeError):
    """The ranks could not give a result; ``str()`` is one line saying why."""


def _error(tmp: Path, spec_path: Path, rank: int) -> tuple[float, str]:
    """When rank ``rank`` failed (epoch seconds; infinity if unknown) and its error line."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(result_path(spec_path, rank).read_text(encoding="utf-8"))
        if isinstance(data, dict) and "error" in data:
            return float(data.get("at", math.inf)), str(data["error"])
    with contextlib.suppress(OSError):
        lines = (tmp / f"rank{rank}.log").read_text(encoding="utf-8", errors="replace").split("\n")
        return math.inf, next((line for line in reversed(lines) if line.strip()), "no output")
    return math.inf, "no output"


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise HarnessError while the ranks run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise HarnessError(f"stopped by {signal.Signals(signum).name}; the ranks were stopped")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _result(spec_path: Path, rank: int) -> dict[str, Any]:
    path = result_path(spec_path, rank)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(
            f"rank {rank} exited 0 without a readable result file {path.name} ({exc})"
        ) from None
    if not isinstance(data, dict):
        raise HarnessError(f"rank {rank}'s result file {path.name} is not a JSON object")
    if "error" in data:
        raise HarnessError(f"rank {rank} failed: {data['error']}")
    return data


def run_ranks(
    spec: dict[str, Any], timeout_s: float, pythonpath: str | None = None
) -> list[dict[str, Any]]:
    """Every rank's result, in rank order; HarnessError (module doc). ``pythonpath``
    (``variants.aiter_pythonpath``; default this process's) follows the source dir."""
    after = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    path = os.pathsep.join(p for p in (str(SRC_DIR), after) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    with tempfile.TemporaryDirectory(prefix="miles-amd-canary-") as name:
        tmp = Path(name)
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps({**spec, "timeout_s": timeout_s}), encoding="utf-8")
        procs: list[subprocess.Popen[bytes]] = []
        worker = [sys.executable, "-m", "miles_amd.canary.worker", str(spec_path)]
        with _signals_raise():
            try:
                for rank in range(spec["world_size"]):
                    with open(tmp / f"rank{rank}.log", "wb") as log:
                        procs.append(
                            subprocess.Popen(
                                [*worker, str(rank)],
                                stdin=subprocess.DEVNULL,
                                stdout=log,
                                stderr=subprocess.STDOUT,
                                env=env,
                                start_new_session=True,
                            )
                        )
                _wait(procs, tmp, spec_path, timeout_s)
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                for proc in procs:
                    proc.wait()
        return [_result(spec_path, rank) for rank in range(len(procs))]


def _wait(
    procs: list[subprocess.Popen[bytes]], tmp: Path, spec_path: Path, timeout_s: float
) -> None:
    started = time.monotonic()
    failed_at: float | None = None
    while True:
        codes = [proc.poll() for proc in procs]
        now = time.monotonic()
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        done = None not in codes
        if done and not failed:
            return
        if failed:
            failed_at = now if failed_at is None else failed_at
            if done or now - failed_at > GRACE_S:
                errors = {rank: _error(tmp, spec_path, rank) for rank in failed}
                rank = min(failed, key=lambda r: (errors[r][0], r))
                raise HarnessError(f"rank {rank} failed (exit {codes[rank]}): {errors[rank][1]}")
        if now - started > timeout_s:
            hung = [rank for rank, code in enumerate(codes) if code is None]
            raise HarnessError(
                f"ranks {hung} still running after {timeout_s:.0f} s: a reducer or collective "
                "hangs (or the plan needs more time: --timeout)"
            )
        time.sleep(POLL_S)


@dataclass(frozen=True)
class Setup:
    """Where the ranks run and what they reduce with."""

    world_size: int
    device: str  # cpu or cuda
    implementation: str
    reducer: str | None = None
    variant: str | None = None
    repeats: int = 1
    aiter_version: str | None = None
    aiter_commit: str | None = None
    rate_source: str = "given: --detect-rate"
    control: ControlRecord | None = None
    collective: str | None = None  # the device groups' backend; default nccl on cuda, else gloo
    aiter_fix: str | None = None  # miles_amd.aiter_fix's value for the aiter the ranks import
    pythonpath: str | None = None  # the ranks' (variants.aiter_pythonpath); None: inherited

    @property
    def backend(self) -> str:
        return self.collective or ("nccl" if self.device == "cuda" else "gloo")


def tensor_dtype(plan: Plan, setup: Setup) -> str:
    return plan.shape.dtype if setup.device == "cuda" else "float32"


def tasks(plan: Plan, groups: int) -> list[dict[str, Any]]:
    """Each size's arms in order; the ``spread`` arm's calls cut into :data:`SPREAD_SLICES`
    slices placed evenly over the run."""
    steady, spread = [], []
    for i, entry in enumerate(plan.entries):
        for arm, calls in entry.arms:
            share = math.ceil(calls / groups)
            if arm != "spread":
                steady.append({"entry": i, "arm": arm, "calls": share})
                continue
            cut = min(SPREAD_SLICES, share)
            spread += [
                (k, {"entry": i, "arm": arm, "calls": share // cut + (1 if k < share % cut else 0)})
                for k in range(cut)
            ]
    queue = [task for _, task in sorted(spread, key=lambda item: item[0])]
    order: list[dict[str, Any]] = []
    placed = 0
    for k, task in enumerate(steady):
        order.append(task)
        due = (k + 1) * len(queue) // max(1, len(steady))
        order += queue[placed:due]
        placed = max(placed, due)
    return [*order, *queue[placed:]]


def spec(plan: Plan, setup: Setup) -> dict[str, Any]:
    """What every rank reads (``canary.worker``)."""
    shape = plan.shape
    return {
        "world_size": setup.world_size,
        "tp": shape.tp,
        "hidden": shape.hidden,
        "backend": setup.backend,
        "device": setup.device,
        "tensor_dtype": tensor_dtype(plan, setup),
        "implementation": setup.implementation,
        "reducer": setup.reducer,
        "repeats": setup.repeats,
        "keep": KEEP,
        "gemm_width": shape.hidden,
        **(GPU_SPEC if setup.device == "cuda" else CPU_SPEC),
        "entries": [{"tokens": e.tokens} for e in plan.entries],
        "tasks": tasks(plan, setup.world_size // shape.tp),
    }


def run(plan: Plan, setup: Setup, timeout_s: float) -> CanaryRecord:
    """Run the plan on the ranks and merge their results; HarnessError otherwise."""
    started = time.time()
    ranks = run_ranks(spec(plan, setup), timeout_s, setup.pythonpath)
    try:
        return merge(plan, setup, ranks, started, time.time())
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise HarnessError(f"the ranks' results do not fit the plan ({exc!r})") from None


def _size(plan: Plan, ranks: list[dict[str, Any]], i: int) -> SizeResult:
    entry, shape = plan.entries[i], plan.shape
    leaders = [r for r in ranks if r["rank"] % shape.tp == 0]  # one per group: counts agree
    arms = []
    for arm, _ in entry.arms:
        mine = [m for r in leaders if (m := r["entries"][i]["arms"].get(arm))]
        counts = (sum(m[k] for m in mine) for k in ("calls", "bad", "blocks", "block_hits"))
        arms.append(ArmResult(arm, *counts))
    calls, mismatches, blocks, block_hits = (
        sum(getattr(a, k) for a in arms)
        for k in ("calls", "mismatches", "blocks", "blocks_with_mismatch")
    )
    layout = Layout(
        entry.tokens, shape.hidden, shape.tp, shape.dtype_size, plan.wave_size, plan.constants
    )
    found = sorted(
        ((m, r["rank"]) for r in ranks for m in r["entries"][i]["kept"]),
        key=lambda item: (item[0]["repeat"], item[0]["call"], item[1], item[0]["index"] or 0),
    )[:KEEP]
    fields = ("repeat", "call", "arm", "index", "expected", "seen", "returned")
    kept = tuple(
        Mismatch(
            **{k: m[k] for k in fields},
            rank=rank,
            matches=m["returned"] is None
            and matches(layout, rank % shape.tp, m["index"], m["expected"], m["seen"]),
        )
        for m, rank in found
    )
    made = [r["entries"][i]["arms"].values() for r in ranks]
    latency = [sum(a["seconds"] for a in m) / sum(a["calls"] for a in m) for m in made if any(m)]
    cost = [sum(a["wall"] for a in m) / sum(a["calls"] for a in m) for m in made if any(m)]
    return SizeResult(
        tokens=entry.tokens,
        kernel=entry.kernel,
        affected=entry.affected,
        wave_class=entry.wave_class,
        exposed=entry.exposed,
        calls=calls,
        mismatches=mismatches,
        wrong_elements=sum(r["entries"][i]["wrong_elements"] for r in ranks),
        blocks=blocks,
        blocks_with_mismatch=block_hits,
        arms=tuple(arms),
        mismatches_kept=kept,
        fingerprint=fingerprint_of(kept),
        latency_us=1e6 * sum(latency) / len(latency) if latency else None,
        cost_us=1e6 * sum(cost) / len(cost) if cost else None,
        rate_upper_99=rate_upper_bound(calls) if mismatches == 0 else None,
        block_rate_upper_99=rate_upper_bound(blocks) if block_hits == 0 else None,
    )


def merge(
    plan: Plan, setup: Setup, ranks: list[dict[str, Any]], started: float, ended: float
) -> CanaryRecord:
    """The record of ``ranks``' results (module doc)."""
    tp = plan.shape.tp
    results = tuple(_size(plan, ranks, i) for i in range(len(plan.entries)))
    repeat_bad = [
        sum(
            r["entries"][i]["mismatches_per_repeat"][k]
            for r in ranks
            if r["rank"] % tp == 0
            for i in range(len(results))
        )
        for k in range(setup.repeats)
    ]
    exposed_calls = sum(r.calls for r in results if r.exposed) // setup.repeats
    return CanaryRecord(
        schema_version=SCHEMA_VERSION,
        implementation=setup.implementation,
        reducer=setup.reducer,
        variant=setup.variant,
        aiter_version=setup.aiter_version,
        aiter_commit=setup.aiter_commit,
        dispatch_source=plan.constants.source,
        aiter_fix=setup.aiter_fix,
        shape=dataclasses.asdict(plan.shape),
        wave_size=plan.wave_size,
        plan=tuple(e.as_dict() for e in plan.entries),
        results=results,
        power=PowerRecord(
            detect_rate=plan.detect_rate,
            rate_source=setup.rate_source,
            confidence=CONFIDENCE,
            exposed_calls=exposed_calls,
            probability=detection_probability(plan.detect_rate, exposed_calls),
            estimated_seconds=plan.estimated_seconds,
            latency_source=plan.latency.source,
        ),
        repeats=setup.repeats,
        repeats_with_mismatch=sum(1 for bad in repeat_bad if bad),
        start_time=started,
        end_time=ended,
        world_size=setup.world_size,
        groups=setup.world_size // tp,
        backend=setup.backend,
        device=setup.device,
        tensor_dtype=tensor_dtype(plan, setup),
        control=setup.control,
    )


def control_fingerprint(first: Mismatch, tokens: int, hidden: int, tp: int, itemsize: int) -> str:
    """Where the control kernel put ``first``'s element, and how far off it was."""
    if first.index is None or first.expected is None or first.seen is None:
        return f"N={tokens} call {first.call}: returned {first.returned}"
    lanes = PACK_BYTES // itemsize
    part = tokens * hidden // lanes // tp
    packed = first.index // lanes
    owner = min(packed // part, tp - 1) if part else tp - 1
    rel = packed - owner * part
    slot = CONTROL_THREADS // tp
    blocks = min(CONTROL_MAX_BLOCKS, max(1, math.ceil(part / slot)))
    off = first.expected - first.seen  # a rank's input steps by 1 a call, the sum by tp
    reader = first.rank % tp
    return (
        f"N={tokens} call {first.call}: rank {reader} read rank {owner}'s segment "
        f"({'its own' if owner == reader else 'a peer'}), block {(rel // slot) % blocks} "
        f"lane {rel % slot}; expected {first.expected:g}, seen {first.seen:g}: "
        f"{off:g} rank input step(s), {off / tp:g} of the sum's"
    )


def control_result(record: CanaryRecord, hidden: int, tp: int, itemsize: int) -> ControlRecord:
    """``canary.json``'s ``control`` from the broken build's run."""
    bad = record.first_bad()
    first = bad.first_mismatch if bad is not None else None
    return ControlRecord(
        implementation=record.implementation,
        calls=sum(r.calls for r in record.results),
        mismatched_calls=record.mismatches,
        caught=record.mismatches > 0,
        fingerprint=(
            control_fingerprint(first, bad.tokens, hidden, tp, itemsize)
            if bad is not None and first is not None
            else None
        ),
    )


def run_control(plan: Plan, setup: Setup, timeout_s: float) -> ControlRecord:
    """The broken build over :func:`control_plan` in ``setup``'s ranks; HarnessError when
    they cannot run it."""
    broken = dataclasses.replace(setup, implementation="control-broken", repeats=1, control=None)
    record = run(control_plan(plan), broken, timeout_s)
    return control_result(record, plan.shape.hidden, plan.shape.tp, plan.shape.dtype_size)


def write_canary(root: Path, record: CanaryRecord) -> Path:
    """``<root>/canary.json``, whole or not at all."""
    path = RunDir(root).canary_json
    atomic_write_text(path, record.to_json())
    return path


PROBE_TIMEOUT_S = 300.0
GPU_PROBE = r"""
import json
out = {"error": None, "gpus": 0, "hip": None, "sglang_error": None, "wave_size": None}
try:
    import torch
    out["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out["hip"] = getattr(torch.version, "hip", None)
    if out["gpus"]:
        out["wave_size"] = getattr(torch.cuda.get_device_properties(0), "warp_size", None)
except BaseException as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
try:
    import sglang.srt.distributed.device_communicators.custom_all_reduce  # noqa: F401
except BaseException as exc:
    out["sglang_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass(frozen=True)
class NodeFacts:
    gpus: int
    torch_error: str | None
    sglang_error: str | None
    aiter_error: str | None
    aiter_version: str | None
    aiter_commit: str | None
    wave_size: int | None = None  # the GPU's wave (warp) size where torch exposes it


def _probe_gpus(python: str = sys.executable) -> dict[str, object]:
    """The probe child's answer; ``{"error": ...}`` when it cannot run or answer."""
    try:
        done = subprocess.run(
            [python, "-c", GPU_PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        answer = json.loads(lines[-1]) if lines else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        return {"error": f"{python} could not probe torch: {exc}"}
    if not isinstance(answer, dict):
        return {"error": f"{python} gave no answer: {done.stderr.strip()[-300:]}"}
    return answer


def node_facts(pythonpath: str) -> NodeFacts:
    """What :func:`unusable` needs, aiter read with ``pythonpath``."""
    from miles_amd.run.probes import git_commit
    from miles_amd.run.probes_allreduce import aiter_commit_fact, read_job_aiter

    gpu = _probe_gpus()
    reading = read_job_aiter(pythonpath, sys.executable)
    error = reading.get("error") or reading.get("ar_import_error")
    package = reading.get("package_dir")
    commit = aiter_commit_fact(
        reading, git_commit(Path(package)) if isinstance(package, str) else None
    ).value
    dists = reading.get("dists")
    version = None
    if isinstance(dists, list) and dists and isinstance(dists[0], dict):
        version = str(dists[0].get("version") or "") or None
    gpus, wave = gpu.get("gpus"), gpu.get("wave_size")
    text = {k: str(gpu[k]) if gpu.get(k) else None for k in ("error", "sglang_error")}
    return NodeFacts(
        gpus=gpus if isinstance(gpus, int) else 0,
        torch_error=text["error"],
        sglang_error=text["sglang_error"],
        aiter_error=str(error) if error else None,
        aiter_version=version,
        aiter_commit=None if commit.startswith("unknown") else commit.split()[0],
        wave_size=wave if type(wave) is int and wave > 0 else None,
    )


def unusable(facts: NodeFacts, implementation: str, tp: int) -> str | None:
    """Why the node run cannot go ahead, naming the fix; None when it can."""
    if facts.torch_error:
        return f"torch does not import ({facts.torch_error}); run in the node's image"
    if facts.gpus == 0:
        return "no GPU visible to torch; run on the MI355X node (check HIP_VISIBLE_DEVICES)"
    if facts.gpus < tp:
        return (
            f"{facts.gpus} GPU(s) visible, fewer than the rollout TP size {tp}; "
            "make all 8 GPUs visible"
        )
    if implementation == "aiter" and facts.aiter_error:
        return (
            f"aiter's CustomAllreduce does not import ({facts.aiter_error}); install amd-aiter "
            "(patched: put the build first on PYTHONPATH, AITER_PATCHED_DIR)"
        )
    if implementation == "sglang" and facts.sglang_error:
        return f"SGLang's CustomAllreduce does not import ({facts.sglang_error}); run in the image"
    return None
