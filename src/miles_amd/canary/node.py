"""Whether this machine can run the hardware canary (torch imports and sees at least a TP
group's GPUs; the implementation's ``CustomAllreduce`` imports), each reason one line naming
the fix, and the aiter provenance the record carries. Probes run in children.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


def probe_gpus(python: str = sys.executable) -> dict[str, object]:
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

    gpu = probe_gpus()
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
