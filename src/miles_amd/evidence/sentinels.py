"""Known log signatures of the recipe's job log (:data:`SENTINELS`, ``fatal`` or ``known``),
and a scan for them: a line is tried only when it holds one of its row's ``needles``; a
``\\r`` ends a segment for matching, line numbers count ``\\n``. Whether a run passes is the
gate's call. Explained in ``docs/cli.md`` ("How the gate reads a run dir", log sentinels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from miles_amd.evidence.types import SentinelHit, Severity
from miles_amd.redact import redact

ALLREDUCE_AITER = "sglang_allreduce_aiter"
ALLREDUCE_FALLBACK = "sglang_allreduce_fallback"
ALLREDUCE_ONE_STAGE = "sglang_allreduce_one_stage"
AITER_FIX_JOB = "aiter_fix_job"
_MAX_TEXT = 500  # characters of the first matching line kept in a hit


@dataclass(frozen=True)
class Sentinel:
    """One known log signature; every line ``regex`` matches holds one of ``needles`` (default:
    the regex, a plain literal)."""

    name: str
    severity: Severity
    regex: str
    reference: str
    advice: str
    needles: tuple[str, ...] = ()
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "needles", self.needles or (self.regex,))
        object.__setattr__(self, "pattern", re.compile(self.regex))


_HTTP_404 = (
    r"(?:\b404\s+Client Error\b|\b404 Not Found\b|HTTP/\d(?:\.\d)?\"\s+404\b"
    r"|\bstatus(?:_code)?\s*[=:]?\s*404\b|\b404,\s*message=)"
)

SENTINELS: tuple[Sentinel, ...] = (
    Sentinel(
        "sglang_lora_skips_moe",
        "fatal",
        r"Current LoRA backend does not support LoRA on MoE layers",
        "recipe: --sglang-lora-backend triton (MoE LoRA)",
        "pass --sglang-lora-backend triton: this backend skips the expert adapters, so rollout "
        "samples from a model whose MoE LoRA weights are never applied",
    ),
    Sentinel(
        "sglang_register_lora_adapter_404",
        "fatal",
        r"^(?=.*register_lora_adapter)(?=.*" + _HTTP_404 + ")",
        "recipe: SGLang must serve /register_lora_adapter",
        "this image's SGLang has no /register_lora_adapter endpoint, which miles calls at the "
        "first LoRA weight update; use an image whose SGLang serves it (miles-amd preflight "
        "checks this before a run)",
        needles=("register_lora_adapter",),
    ),
    Sentinel(
        "hip_memory_access_fault",
        "fatal",
        r"Memory access fault by GPU",
        "HIP runtime: GPU page fault",
        "a GPU kernel touched invalid memory and the process was killed; rerun with "
        "AMD_SERIALIZE_KERNEL=3 to find the kernel and record the aiter variant",
    ),
    Sentinel(
        "gpu_out_of_memory",
        "fatal",
        # Ray's own OutOfMemoryError (and a task's error wrapping it) is host RAM, below
        r"(?:HIP|CUDA) out of memory|(?<!ray\.exceptions\.)(?<!RayTaskError\()\bOutOfMemoryError"
        r"|hipErrorOutOfMemory",
        "torch / HIP allocator",
        "a GPU ran out of memory; check for leftover processes holding GPU memory "
        "(amd-smi process), then lower --sglang-mem-fraction-static or --max-tokens-per-gpu",
        needles=("out of memory", "OutOfMemory"),
    ),
    # Ray's memory monitor (raylet, Ray 2.60: "%d worker(s) were killed due to the node running
    # low on memory. %s"; before 2.55: "Task was killed due to the node running low on
    # memory.") and the kernel's OOM killer (mm/oom_kill.c: "%s: Killed process %d (%s)
    # total-vm:...", %s "Out of memory" or "Memory cgroup out of memory")
    Sentinel(
        "host_out_of_memory",
        "fatal",
        r"killed due to the node running low on memory|: Killed process \d+ \(.*\) total-vm:",
        "Ray memory monitor / Linux OOM killer: host RAM",
        "the node's host RAM ran out, not a GPU's (lowering --sglang-mem-fraction-static does "
        "not help): look for another job or a leftover run holding RAM (free -g), give the "
        "container more RAM, or keep less in the rollout workers' host RAM (the recipe's "
        "--lora-base-cpu-backup keeps a CPU mirror of the base weights in each SGLang engine)",
        needles=("running low on memory", "Killed process"),
    ),
    Sentinel(
        "megatron_nan_grad_norm",
        "fatal",
        r"found NaN in local grad norm",
        "Megatron-LM distributed optimizer NaN check",
        "training produced NaN gradients; compare train/grad_norm and "
        "train/train_rollout_logprob_abs_diff before this step and rerun to see if it repeats",
    ),
    Sentinel(
        "miles_ci_check_failed",
        "fatal",
        r"CI check failed",
        "miles --ci-test checks",
        "a miles CI assertion failed; the matched line names the check and its values",
    ),
    Sentinel(
        "collective_communication_error",
        "fatal",
        r"\b[NR]CCL error\b|DistBackendError|Watchdog caught collective operation timeout",
        "torch.distributed / RCCL",
        "a collective failed or timed out, so every rank of that group is stuck or dead; the "
        "first failing rank's lines above name the cause (often an earlier crash on one GPU)",
        needles=("CCL error", "DistBackendError", "Watchdog caught collective operation timeout"),
    ),
    Sentinel(
        "sglang_scheduler_crashed",
        "fatal",
        r"Scheduler hit an exception|Received sigquit from a child process",
        "SGLang scheduler process",
        "an SGLang rollout engine died; its traceback is on the matched line and the lines "
        "after it",
        needles=("Scheduler hit an exception", "Received sigquit from a child process"),
    ),
    Sentinel(
        "ray_actor_died",
        "fatal",
        r"ActorDiedError|The actor died unexpectedly before finishing this task"
        r"|A worker died or was killed while executing a task",
        "Ray core: actor / worker death",
        "a Ray actor (trainer or rollout) died and the recipe does not restart actors; the "
        "cause is just above (check the kernel OOM killer in dmesg)",
        needles=(
            "ActorDiedError",
            "The actor died unexpectedly",
            "A worker died or was killed",
        ),
    ),
    Sentinel(
        "python_fatal_error",
        "fatal",
        r"Fatal Python error:",
        "CPython fatal error (segfault / abort)",
        "a process crashed in native code; the lines after it show the Python stack",
    ),
    Sentinel(
        "megatron_moe_router_not_fp32",
        "known",
        re.escape("Using a large number of experts (e.g. >=32) without fp32 routing"),
        "radixark/miles#3263",
        "config fidelity only: the bridge LoRA setup drops moe_router_dtype, so the router "
        "GEMM runs bf16; printed once per trainer rank (8 expected)",
        needles=("without fp32 routing",),
    ),
    # SGLang's all-reduce route (sglang custom_all_reduce.py dispatch_custom_allreduce and
    # server_args.py), judged by the gate's allreduce.path check (miles_amd.judge.allreduce)
    Sentinel(
        ALLREDUCE_AITER,
        "known",
        re.escape("[AR] Using AiterCustomAllreduce"),
        "sglang custom_all_reduce.py: aiter's all-reduce taken",
        "SGLang's rollout all-reduce is aiter's custom all-reduce (where ROCm/aiter#5694 "
        "lives): the premise of the stock/patched comparison",
        needles=("Using AiterCustomAllreduce",),
    ),
    Sentinel(
        ALLREDUCE_FALLBACK,
        "known",
        re.escape("[AR] Aiter custom all-reduce not available; falling back to sglang"),
        "sglang custom_all_reduce.py: aiter's all-reduce did not import",
        "SGLang fell back to its own all-reduce: aiter's custom all-reduce did not import",
        needles=("Aiter custom all-reduce not available",),
    ),
    Sentinel(
        ALLREDUCE_ONE_STAGE,
        "known",
        re.escape("AMD/ROCm: Using 1-stage all-reduce kernel (deterministic)"),
        "sglang server_args.py: deterministic inference",
        "deterministic inference: SGLang takes its own 1-stage all-reduce, not aiter's",
        needles=("Using 1-stage all-reduce kernel",),
    ),
    Sentinel(
        "aiter_untuned_gemm_config",
        "known",
        r"not found tuned config\b.*?will use default config",
        "aiter tuned GEMM tables",
        "a GEMM shape has no tuned aiter config and uses the default kernel config; "
        "performance only",
        needles=("not found tuned config",),
    ),
    # The job's own aiter fingerprint (miles_amd.aiter_fix, the plan's JobSpec.command): the
    # entrypoint's first line, unprefixed; judged by the gate's allreduce.fix check
    Sentinel(
        AITER_FIX_JOB,
        "known",
        r"^MILES_AMD_AITER_FIX \{",
        "miles_amd.aiter_fix, run inside the job",
        "the aiter the job's Python imports and whether it holds ROCm/aiter#5694's fix",
        needles=("MILES_AMD_AITER_FIX",),
    ),
)


class SentinelScan:
    """The sentinel hits of one log, fed in order as blocks of whole lines (``line_blocks``)."""

    def __init__(self) -> None:
        self._found: dict[str, list] = {}  # name -> [count, first line number, first text]

    def feed(self, first_line: int, text: str) -> None:
        for sentinel in SENTINELS:
            starts = _needle_lines(text, sentinel.needles)
            line_number, counted_to = first_line, 0
            for start in starts:
                line = text[start : _segment_end(text, start)]
                if not sentinel.pattern.search(line):
                    continue
                line_number += text.count("\n", counted_to, start)
                counted_to = start
                entry = self._found.get(sentinel.name)
                if entry is None:
                    kept = line.rstrip("\r")[:_MAX_TEXT]
                    self._found[sentinel.name] = [1, line_number, kept]
                else:
                    entry[0] += 1

    def hits(self) -> tuple[SentinelHit, ...]:
        found = self._found
        return tuple(
            SentinelHit(
                name=s.name,
                severity=s.severity,
                count=found[s.name][0],
                first_line=found[s.name][1],
                first_text=redact(found[s.name][2]),  # the log's own line, quoted onward
                reference=s.reference,
                advice=s.advice,
            )
            for s in SENTINELS
            if s.name in found
        )


def _needle_lines(text: str, needles: tuple[str, ...]) -> list[int]:
    """Start offsets, in order, of the segments (``\\n`` or ``\\r`` ended) holding a needle."""
    starts: set[int] = set()
    for needle in needles:
        at = text.find(needle)
        while at >= 0:
            line_start = text.rfind("\n", 0, at) + 1
            cr = text.rfind("\r", line_start, at)
            starts.add(line_start if cr < 0 else cr + 1)
            end = _segment_end(text, at)
            if end == len(text):
                break
            at = text.find(needle, end)
    return sorted(starts)


def _segment_end(text: str, at: int) -> int:
    newline = text.find("\n", at)
    line_end = len(text) if newline < 0 else newline
    cr = text.find("\r", at, line_end)
    return line_end if cr < 0 else cr
