"""The canary's plan, purely from the recipe and the dispatch constants: the all-reduce sizes,
the calls that catch a per-call rate with 99% confidence spread over the rollout conditions,
and their estimated time. ``docs/node.md`` ("How the plan is built", "Statistics").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from miles_amd.canary.kernel import (
    CDNA_WAVE,
    PINNED,
    DispatchConstants,
    dispatch,
    uses_custom_ar,
    wave_class,
)
from miles_amd.recipe.settings import Recipe

CONFIDENCE = 0.99
CONTROL_SHARE = 0.1
MIN_CONTROL_CALLS = 10
# The rollouts' exposed calls per run and the spike rate per stock run (docs/node.md,
# "Statistics"): rollouts x engines x prefill forwards x all-reduces per forward x exposed share.
ROLLOUTS_PER_RUN, ENGINES, PREFILL_FORWARDS, ALL_REDUCES_PER_FORWARD = 20, 2, 4, 49
EXPOSED_SHARE = 0.5
SPIKE_RATE_PER_RUN = 0.05
SGLANG_DEFAULT_CHUNKED_PREFILL = 16384  # sglang 0.5.16 server_args.py, gpu_mem >= 160 GiB
DTYPE_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}
UNIFORM_STEP = 64  # 90·N packs per rank is a multiple of 128 lanes iff N % 64 == 0 (TP 4)
CPU_MAX_TOKENS = 128
ARMS = ("back_to_back", "gemm", "skew", "spread")  # docs/node.md, "Rollout conditions"
# sglang 0.5.16 custom_all_reduce.py: _MAX_CAR_SIZE on HIP
SGLANG_MAX_BYTES = 2 * 8192 * 1024
# the gemm arm's (N, hidden) x (hidden, hidden) at an assumed 300 TFLOP/s; the skew arm's delay
GEMM_FLOPS = 300e12
SKEW_S = 20e-6
CONTROL_CALLS = 200  # the positive control's calls per suspect size at most


def _check_rate(p: float) -> None:
    if not (0.0 < p < 1.0) or not math.isfinite(p):
        raise ValueError(f"detect rate {p!r} is not in (0, 1)")


def exposed_calls_per_run() -> int:
    calls = ROLLOUTS_PER_RUN * ENGINES * PREFILL_FORWARDS * ALL_REDUCES_PER_FORWARD
    return round(calls * EXPOSED_SHARE)


def implied_rate(spike_rate: float = SPIKE_RATE_PER_RUN, exposed: int | None = None) -> float:
    """The least per-call rate that spikes a fraction ``spike_rate`` of runs: -ln(1 - s) / E."""
    _check_rate(spike_rate)
    return -math.log1p(-spike_rate) / (exposed_calls_per_run() if exposed is None else exposed)


def calls_needed(p: float, confidence: float = CONFIDENCE) -> int:
    _check_rate(p)
    _check_rate(confidence)
    return math.ceil(math.log1p(-confidence) / math.log1p(-p))


def detection_probability(p: float, calls: int) -> float:
    """``1 - (1 - p)^calls``."""
    _check_rate(p)
    return -math.expm1(calls * math.log1p(-p))


def rate_upper_bound(calls: int, confidence: float = CONFIDENCE) -> float | None:
    """The largest per-call rate ``calls`` clean calls do not exclude; None for 0 calls."""
    return -math.expm1(math.log1p(-confidence) / calls) if calls > 0 else None


def allocate(
    seconds_per_call: Sequence[float],
    affected: Sequence[bool],
    needed: int,
    control_share: float = CONTROL_SHARE,
    min_control_calls: int = MIN_CONTROL_CALLS,
) -> list[int]:
    """Calls per entry: equal time per affected size, ``control_share`` of it per control."""
    if len(seconds_per_call) != len(affected) or any(t <= 0 for t in seconds_per_call):
        raise ValueError("one positive time per entry is needed")
    rates = [1.0 / t for t, hit in zip(seconds_per_call, affected, strict=True) if hit]
    if not rates:
        raise ValueError("no affected size to spend the budget on")
    share = needed / sum(rates)
    return [
        math.ceil(share / t)
        if hit
        else max(min_control_calls, math.ceil(control_share * share / t))
        for t, hit in zip(seconds_per_call, affected, strict=True)
    ]


@dataclass(frozen=True)
class RecipeShape:
    """The rollout engines' all-reduce, as the recipe sets it up."""

    hidden: int
    dtype: str
    tp: int
    engines: int
    requests_per_engine: int
    chunked_prefill_size: int

    @property
    def dtype_size(self) -> int:
        return DTYPE_SIZES[self.dtype]

    def nbytes(self, tokens: int) -> int:
        return tokens * self.hidden * self.dtype_size


def recipe_shape(recipe: Recipe) -> RecipeShape:
    """``docs/node.md`` ("How the plan is built"): from the fields and the last value of each
    flag in the argv."""
    argv, flags = recipe.argv(), {}
    for i, arg in enumerate(argv):
        if "=" in arg and arg.startswith("--"):
            flag, value = arg.split("=", 1)
            flags[flag] = value
        elif i + 1 < len(argv):
            flags[arg] = argv[i + 1]
    hidden, dtype = flags.get("--hidden-size"), flags.get("--sglang-dtype")
    if hidden is None or dtype not in DTYPE_SIZES:
        raise ValueError(f"the recipe's argv has no usable --hidden-size/--sglang-dtype ({dtype})")
    tp = recipe.rollout_num_gpus_per_engine
    engines = recipe.num_gpus // tp
    return RecipeShape(
        hidden=int(hidden),
        dtype=dtype,
        tp=tp,
        engines=engines,
        requests_per_engine=recipe.rollout_batch_size * recipe.n_samples_per_prompt // engines,
        chunked_prefill_size=int(
            flags.get("--sglang-chunked-prefill-size", SGLANG_DEFAULT_CHUNKED_PREFILL)
        ),
    )


def sglang_decode_sizes(requests: int) -> list[int]:
    """SGLang's CUDA-graph batch sizes (``server_args._generate_cuda_graph_batch_sizes``) up to
    the first that holds ``requests``."""
    ladder = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, 4097, 32)]
    return [bs for bs in ladder if bs < requests] + [bs for bs in ladder if bs >= requests][:1]


@dataclass(frozen=True)
class LatencyModel:
    """Seconds per call: kernel ``base_s + bytes / bytes_per_s`` plus the harness's own cost at
    ``N`` tokens (linear between measured points), and where they come from."""

    base_s: float
    bytes_per_s: float
    harness_us: tuple[tuple[int, float], ...]  # (tokens, us per call), ascending
    source: str

    def harness_s(self, tokens: int) -> float:
        points = self.harness_us
        if tokens <= points[0][0]:
            return points[0][1] * 1e-6
        for (n0, t0), (n1, t1) in pairwise(points):
            if tokens <= n1:
                return (t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)) * 1e-6
        return points[-1][1] * tokens / points[-1][0] * 1e-6

    def seconds(self, nbytes: int, tokens: int) -> float:
        return self.base_s + nbytes / self.bytes_per_s + self.harness_s(tokens)


NODE_LATENCY = LatencyModel(
    base_s=12e-6,
    bytes_per_s=75e9,
    # whole blocks per call, 4 ranks of canary.worker on one H200 (docs/node.md, "Statistics")
    harness_us=(
        (1, 90.0),
        (32, 81.0),
        (127, 86.0),
        (255, 108.0),
        (1023, 237.0),
        (4095, 858.0),
        (11650, 2361.0),
    ),
    source=(
        "kernel: published, not measured here (sgl-project/sglang#6619, ROCm/FlyDSL#326): "
        "12 us + bytes / 75 GB/s; harness: whole blocks measured with the current worker on one "
        "H200, 90 us at N=1 to 2361 us at N=11650 (4 ranks time-sharing the GPU: from N=4095 "
        "up to 4x a node's)"
    ),
)
CPU_LATENCY = LatencyModel(
    base_s=2e-3,
    bytes_per_s=1.0e9,
    harness_us=((1, 0.0),),
    source=(
        "measured: gloo, 4 CPU processes on 2 cores, 2-8 ms per call at any of the CPU plan's "
        "sizes (benchmarks/bench_canary.py)"
    ),
)


@dataclass(frozen=True)
class Target:
    """Where a plan runs: its time model, its largest size and the controls' share."""

    latency: LatencyModel
    max_tokens: int | None
    control_share: float
    min_control_calls: int


NODE = Target(NODE_LATENCY, None, CONTROL_SHARE, MIN_CONTROL_CALLS)
CPU = Target(CPU_LATENCY, CPU_MAX_TOKENS, 0.02, 4)


@dataclass(frozen=True)
class PlanEntry:
    """One size of the plan: its class under both models and its calls per arm."""

    tokens: int
    bytes: int
    kernel: str
    naive: bool
    uniform_trip_count: bool
    affected: bool
    wave_class: str
    exposed: bool
    blocks: int
    role: str  # decode, prefill, control
    arms: tuple[tuple[str, int], ...]
    implementation: str

    @property
    def calls(self) -> int:
        return sum(calls for _, calls in self.arms)

    def as_dict(self) -> dict[str, object]:
        """The fields in order, ``calls`` before ``arms`` (a dict) and ``implementation``."""
        fields = dataclasses.asdict(self)
        arms, implementation = dict(fields.pop("arms")), fields.pop("implementation")
        return {**fields, "calls": self.calls, "arms": arms, "implementation": implementation}


@dataclass(frozen=True)
class Plan:
    shape: RecipeShape
    constants: DispatchConstants
    entries: tuple[PlanEntry, ...]
    detect_rate: float
    latency: LatencyModel
    groups: int
    wave_size: int

    @property
    def exposed_calls(self) -> int:
        return sum(e.calls for e in self.entries if e.exposed)

    @property
    def probability(self) -> float:
        return detection_probability(self.detect_rate, self.exposed_calls)

    @property
    def estimated_seconds(self) -> float:
        """All calls with their arms' work, the TP groups side by side."""
        hidden = self.shape.hidden
        total = sum(
            e.calls * self.latency.seconds(e.bytes, e.tokens)
            + dict(e.arms).get("gemm", 0) * (2.0 * e.tokens * hidden * hidden / GEMM_FLOPS)
            + dict(e.arms).get("skew", 0) * SKEW_S
            for e in self.entries
        )
        return total / self.groups


def token_sizes(
    shape: RecipeShape, constants: DispatchConstants, top: int, wave: int = CDNA_WAVE
) -> list[int]:
    """Decode as SGLang pads it, exposed prefill sizes and matched controls, ascending
    (``docs/node.md``, "How the plan is built")."""
    decode = [n for n in sglang_decode_sizes(shape.requests_per_engine) if n <= top]
    powers = [UNIFORM_STEP << k for k in range(top.bit_length()) if UNIFORM_STEP << k <= top]
    candidates = {top} | {p + d for p in powers for d in (-1, 0, 1)}
    low = shape.requests_per_engine

    def cls(n: int) -> str:
        return wave_class(dispatch(shape.nbytes(n), shape.tp, shape.dtype_size, True, constants),
                          shape.tp, wave)  # fmt: skip

    def find(start: int, step: int, wanted: str) -> int | None:
        span = range(start, low if step < 0 else top + 1, step) if low < start <= top else ()
        return next((n for n in span if cls(n) == wanted), None)

    first_exposed = find(low + 1, 1, "exposed")
    picks = [
        first_exposed,
        find(top // 2, 1, "exposed"),
        find(low + 1, 1, "early-no-read"),
        find((first_exposed or top + 1) - 1, -1, "early-no-read"),
    ]
    candidates |= {n for n in picks if n is not None}
    kept = {n for n in candidates if low < n <= top and cls(n) != "not-2stage"}
    return sorted(set(decode) | kept)


def build_plan(
    shape: RecipeShape,
    implementation: str,
    detect_rate: float,
    *,
    target: Target = NODE,
    constants: DispatchConstants = PINNED,
    groups: int = 1,
    tokens: Sequence[int] = (),
    wave_size: int = CDNA_WAVE,
    arms: Sequence[str] = ARMS,
) -> Plan:
    """The plan; ``tokens`` keeps only those sizes. ValueError for a rate outside (0, 1), a
    size outside the plan's range, or no size where a stale read is possible."""
    needed = calls_needed(detect_rate)
    if wave_size < 1:
        raise ValueError(f"wave size {wave_size}: must be a positive lane count")
    # the largest N: within the chunk, the target's cap and the implementation's size limit
    top = min(target.max_tokens or shape.chunked_prefill_size, shape.chunked_prefill_size)
    limit = constants.car_max_size if implementation != "sglang" else SGLANG_MAX_BYTES
    while top > 0 and not (
        uses_custom_ar(shape.nbytes(top), constants) and shape.nbytes(top) <= limit
    ):
        top -= 1
    sizes = token_sizes(shape, constants, top, wave_size)
    if tokens:
        outside = sorted({n for n in tokens if not 1 <= n <= top})
        if outside:
            raise ValueError(f"tokens {outside} are outside this plan's 1..{top}")
        sizes = sorted(set(tokens))
    shapes = [dispatch(shape.nbytes(n), shape.tp, shape.dtype_size, True, constants) for n in sizes]
    waves = [wave_class(d, shape.tp, wave_size) for d in shapes]
    if "exposed" not in waves:
        raise ValueError(
            f"none of the sizes {sizes} is in the suspect class (a {wave_size}-lane wave that "
            "leaves stage 1 early and still reads peer data)"
        )
    calls = allocate(
        [target.latency.seconds(shape.nbytes(n), n) for n in sizes],
        [w == "exposed" for w in waves],
        needed,
        target.control_share,
        target.min_control_calls,
    )
    decode = set(sglang_decode_sizes(shape.requests_per_engine))
    entries = tuple(
        PlanEntry(
            tokens=n,
            bytes=shape.nbytes(n),
            kernel=d.kernel,
            naive=d.naive,
            uniform_trip_count=d.uniform_trip_count,
            affected=d.affected,
            wave_class=w,
            exposed=w == "exposed",
            blocks=d.blocks,
            role="decode" if n in decode else "prefill" if w == "exposed" else "control",
            arms=tuple((arm, -(-c // len(arms))) for arm in arms),
            implementation=implementation,
        )
        for n, d, w, c in zip(sizes, shapes, waves, calls, strict=True)
    )
    return Plan(shape, constants, entries, detect_rate, target.latency, max(1, groups), wave_size)


def control_plan(plan: Plan, calls: int = CONTROL_CALLS) -> Plan:
    """The broken build's plan: ``plan``'s suspect sizes (either model), at most ``calls``
    back-to-back calls each."""
    entries = tuple(
        dataclasses.replace(
            e, arms=((ARMS[0], min(e.calls, calls)),), implementation="control-broken"
        )
        for e in plan.entries
        if e.affected or e.exposed
    )
    return dataclasses.replace(plan, entries=entries)
