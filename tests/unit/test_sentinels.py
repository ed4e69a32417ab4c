"""miles_amd.evidence.sentinels: the signature table and the scan, on real log text.

Lines go through :class:`SentinelScan` as ``load_run`` feeds it; whole logs through
``load_run`` itself (its ``sentinels``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_amd.evidence.job_log import CHUNK
from miles_amd.evidence.load import load_run
from miles_amd.evidence.sentinels import SENTINELS, SentinelScan
from miles_amd.evidence.types import SentinelHit

TRAIN = "(MegatronTrainRayActor pid=4242) [2026-11-20 10:03:50.007 ] "
ROLLOUT = "(RolloutManager pid=5151) [2026-11-20 10:04:12.311 ] "

# Lines as the job log carries them, one or more per sentinel.
SAMPLES: dict[str, list[str]] = {
    "sglang_lora_skips_moe": [
        "(SGLangEngine pid=6001) [2026-11-20 10:01:02 TP0] Current LoRA backend does not "
        "support LoRA on MoE layers; skipping MoE layer model.layers.0.mlp.experts",
    ],
    "sglang_register_lora_adapter_404": [
        ROLLOUT + "http_utils.py:88 - requests.exceptions.HTTPError: 404 Client Error: Not Found "
        "for url: http://10.0.0.1:30000/register_lora_adapter",
        "(SGLangEngine pid=6001) INFO:     10.0.0.1:51234 - "
        '"POST /register_lora_adapter HTTP/1.1" 404 Not Found',
        "httpx.HTTPStatusError: Client error '404 Not Found' for url "
        "'http://10.0.0.1:30000/register_lora_adapter'",
    ],
    "hip_memory_access_fault": [
        "(MegatronTrainRayActor pid=4243) Memory access fault by GPU node-9 (Agent handle: "
        "0x55d1c7a0) on address 0x7f1c00000000. Reason: Unknown.",
    ],
    "gpu_out_of_memory": [
        TRAIN + "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 3 "
        "has a total capacity of 287.98 GiB of which 1.02 GiB is free.",
        "RuntimeError: HIP error: hipErrorOutOfMemory",
    ],
    # Ray's memory monitor as Ray 2.60's raylet words it, as Ray before 2.55 did, as the driver
    # sees it; the kernel's OOM killer (mm/oom_kill.c) when dmesg reaches the log
    "host_out_of_memory": [
        "ray.exceptions.OutOfMemoryError: 1 worker(s) were killed due to the node running low "
        "on memory. Memory on the node (IP: 10.0.0.1, ID: 4cb2) was 1843.2GB used / 1900.0GB "
        "limit (0.970105)",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "(raylet) Task SGLangEngine.init failed due to oom. Error: 2 worker(s) were killed due to "
        "the node running low on memory.",
        "[Thu Dec  3 10:07:00 2026] Out of memory: Killed process 6001 (ray::SGLangEng) "
        "total-vm:912345678kB, anon-rss:401234567kB, file-rss:0kB, shmem-rss:0kB, UID:0",
    ],
    "megatron_nan_grad_norm": [
        TRAIN + "distributed.py:311 - RuntimeError: Rank 3: found NaN in local grad norm for "
        "bucket #0 in backward pass before data-parallel communication collective.",
    ],
    "miles_ci_check_failed": [
        TRAIN + "ci_utils.py:40 - CI check failed: train/ppo_kl=0.31 exceeds 0.05",
    ],
    "collective_communication_error": [
        TRAIN + "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
        "unhandled system error, NCCL version 2.21.5",
        "[rank2]:[E1120 10:05:00.1 ProcessGroupNCCL.cpp:616] [Rank 2] Watchdog caught collective "
        "operation timeout: WorkNCCL(SeqNum=88, OpType=ALLREDUCE) ran for 600000 milliseconds",
    ],
    "sglang_scheduler_crashed": [
        "(SGLangEngine pid=6001) [2026-11-20 10:06:00 TP1] Scheduler hit an exception: "
        "Traceback (most recent call last):",
        "(SGLangEngine pid=6001) [2026-11-20 10:06:00] Received sigquit from a child process. "
        "It usually means the child failed.",
    ],
    "ray_actor_died": [
        "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
        "A worker died or was killed while executing a task by an unexpected system error.",
    ],
    "python_fatal_error": [
        "(MegatronTrainRayActor pid=4244) Fatal Python error: Segmentation fault",
    ],
    "megatron_moe_router_not_fp32": [
        TRAIN + "router.py:64 - Using a large number of experts (e.g. >=32) without fp32 "
        "routing. Consider enabling moe_router_dtype for better numerical stability.",
    ],
    "sglang_allreduce_aiter": [
        "(SGLangEngine pid=6001) [2026-11-20 10:01:02 TP0] [AR] Using AiterCustomAllreduce "
        "(AMD default)",
    ],
    "sglang_allreduce_fallback": [
        "(SGLangEngine pid=6001) [2026-11-20 10:01:02 TP1] [AR] Aiter custom all-reduce not "
        "available; falling back to sglang CustomAllreduce. Details: No module named 'aiter'",
    ],
    "sglang_allreduce_one_stage": [
        "(SGLangEngine pid=6001) [2026-11-20 10:01:00] AMD/ROCm: Using 1-stage all-reduce "
        "kernel (deterministic)",
    ],
    "aiter_fix_job": [
        'MILES_AMD_AITER_FIX {"header": null, "package_dir": null, "value": "unknown: no module '
        "aiter on this Python's path\"}",
    ],
    "aiter_untuned_gemm_config": [
        "(SGLangEngine pid=6001) [aiter] shape is M:4096, N:2880, K:2880, not found tuned config "
        "in /sgl-workspace/aiter/aiter/configs/bf16_tuned_gemm.csv, will use default config!",
    ],
}

# Healthy lines, and lines that look close to a signature but are not one.
CLEAN = [
    TRAIN + "log_utils.py:542 - step 3: {'train/loss': 0.01, 'train/pg_clipfrac': 0.0, "
    "'train/train_rollout_logprob_abs_diff': 0.0172, 'train/grad_norm': nan, 'train/step': 3}",
    ROLLOUT + "log_utils.py:560 - perf 3: {'rollout/response_len/mean': 2920.0, "
    "'perf/rollout_time': 95.2}",
    "(SGLangEngine pid=404) INFO:     10.0.0.1:51234 - "
    '"POST /register_lora_adapter HTTP/1.1" 200 OK',
    ROLLOUT + "sglang_client.py:88 - register_lora_adapter miles_lora took 404 ms",
    "Traceback (most recent call last):",
    '  File "/root/miles/miles/utils/http_utils.py", line 88, in post',
    "2026-11-20 10:00:01,000 INFO worker.py:1832 -- Connected to Ray cluster.",
    # an actor printing the job's marker is not the job's entrypoint (Ray prefixes its lines)
    '(SGLangEngine pid=6001) MILES_AMD_AITER_FIX {"value": "fixed: /x sha256:0123456789ab"}',
    TRAIN + "arguments.py:12 - moe_router_dtype ........................ fp32",
    TRAIN + "arguments.py:12 - sglang_lora_backend ..................... triton",
    "NCCL_NVLS_ENABLE=0 CUDA_DEVICE_MAX_CONNECTIONS=1",
    "",
]


BY_NAME = {s.name: s for s in SENTINELS}


def scan_lines(lines: list[str], *, start_line: int = 1) -> tuple[SentinelHit, ...]:
    """The hits of ``lines`` fed as one block of whole lines, numbered from ``start_line``."""
    scan = SentinelScan()
    scan.feed(start_line, "\n".join(line.rstrip("\n") for line in lines))
    return scan.hits()


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_each_sample_hits_exactly_its_sentinel(name: str) -> None:
    sentinel = BY_NAME[name]
    assert len(BY_NAME) == len(SENTINELS) and set(SAMPLES) == set(BY_NAME)
    assert sentinel.reference and (sentinel.severity == "known" or sentinel.advice.strip())
    for line in SAMPLES[name]:
        assert any(n in line for n in sentinel.needles), line  # the prefilter hides no match
        hits = scan_lines([line])
        assert [(h.name, h.count, h.first_line) for h in hits] == [(name, 1, 1)], line
        assert (hits[0].severity, hits[0].first_text) == (sentinel.severity, line)
        assert (hits[0].reference, hits[0].advice) == (sentinel.reference, sentinel.advice)


def test_near_misses_hit_nothing_and_hits_come_in_table_order_with_counts() -> None:
    """Healthy lines and near misses (a 200 OK adapter call, Ray's own host OutOfMemoryError
    wrapped in a task error, the aiter words in the wrong order) hit nothing; Megatron's
    fp32-routing warning once per rank is 8 counts of a known signature."""
    near = [
        "ray.exceptions.RayTaskError(OutOfMemoryError): ray::SGLangEngine.init()",
        "will use default config; not found tuned config",
    ]
    assert scan_lines(CLEAN + near) == ()
    oom = SAMPLES["gpu_out_of_memory"]
    moe = SAMPLES["sglang_lora_skips_moe"][0]
    warning = SAMPLES["megatron_moe_router_not_fp32"][0]
    ranks = [warning.replace("pid=4242", f"pid={4242 + rank}") for rank in range(8)]
    log = [CLEAN[0], oom[0], CLEAN[1], moe, oom[1], moe + " (again)", *ranks]
    hits = scan_lines(log, start_line=100)
    assert [(h.name, h.severity, h.count, h.first_line) for h in hits] == [
        ("sglang_lora_skips_moe", "fatal", 2, 103),
        ("gpu_out_of_memory", "fatal", 2, 101),
        ("megatron_moe_router_not_fp32", "known", 8, 106),
    ]
    assert hits[2].first_text == warning


def test_first_text_is_stripped_bounded_and_redacted() -> None:
    line = SAMPLES["miles_ci_check_failed"][0] + " x" * 1000 + "\r\n"
    (hit,) = scan_lines([line])
    assert hit.first_text.startswith(SAMPLES["miles_ci_check_failed"][0])
    assert not hit.first_text.endswith("\n") and len(hit.first_text) == 500
    (hit,) = scan_lines([SAMPLES["python_fatal_error"][0] + " HF_TOKEN=hf_abcdefgh"])
    assert hit.first_text.endswith("HF_TOKEN=<redacted>")


def test_the_log_scan_numbers_lines_across_blocks_and_survives_bad_bytes(tmp_path: Path) -> None:
    """100,000 lines over several read blocks counted exactly; a ``\\r`` is no new line; bad
    UTF-8 is read on (speed is benchmarks/bench_log.py's job)."""
    (tmp_path / "a").mkdir()
    block = "\n".join(CLEAN[6:8] * 499 + [SAMPLES["megatron_nan_grad_norm"][0]] * 2) + "\n"
    (tmp_path / "a" / "job.log").write_text(block * 100, encoding="utf-8")
    assert (tmp_path / "a" / "job.log").stat().st_size > 2 * CHUNK
    (hit,) = load_run(tmp_path / "a").sentinels
    assert (hit.name, hit.count, hit.first_line) == ("megatron_nan_grad_norm", 200, 999)
    (tmp_path / "b").mkdir()
    fault = SAMPLES["hip_memory_access_fault"][0].encode()
    lines = b"progress 10%\rprogress 50%\r\n\xff\xfe broken bytes\n" + fault + b"\n"
    (tmp_path / "b" / "job.log").write_bytes(lines)
    (hit,) = load_run(tmp_path / "b").sentinels
    assert (hit.name, hit.first_line) == ("hip_memory_access_fault", 3)
    (tmp_path / "c").mkdir()  # no log: no hits
    assert load_run(tmp_path / "c").sentinels == ()


def test_a_fatal_sentinels_fix_reaches_the_gates_failure(tmp_path: Path) -> None:
    from miles_amd.baseline.model import load_baseline
    from miles_amd.judge.gate import judge

    (tmp_path / "job.log").write_text(SAMPLES["sglang_lora_skips_moe"][0] + "\n")
    verdict = judge(load_run(tmp_path), load_baseline("patched"))
    (check,) = [c for c in verdict.checks if c.name == "sentinel.sglang_lora_skips_moe"]
    assert check.failed and f"fix: {BY_NAME['sglang_lora_skips_moe'].advice}" in check.detail
