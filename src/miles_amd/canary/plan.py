"""The canary's plan, purely from the recipe and the dispatch constants: the all-reduce sizes
(decode as SGLang pads them, exposed prefill sizes, matched controls), the calls that catch a
per-call rate with 99% confidence spread over the rollout conditions, and their estimated time.
A clean canary bounds the rate; it does not show the kernel race-free. ``docs/node.md`` ("How
the plan is built", "Statistics").
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
# The rollouts' exposed calls per run (docs/node.md, "Statistics"): 20 rollouts x 2 engines x at
# most 4 prefill forwards per engine and rollout x 49 all-reduces per forward (24 layers x 2 and
# the vocab-parallel embedding) x 1/2 (the share of prefill sizes >= 114 whose 90·N mod 128 is in
# 1..64); and the spike rate per stock run the A/B must be able to explain.
ROLLOUTS_PER_RUN = 20
ENGINES = 2
PREFILL_FORWARDS = 4
ALL_REDUCES_PER_FORWARD = 49
EXPOSED_SHARE = 0.5
SPIKE_RATE_PER_RUN = 0.05


def _check_rate(p: float) -> None:
    if not (0.0 < p < 1.0) or not math.isfinite(p):
        raise ValueError(f"detect rate {p!r} is not in (0, 1)")


def exposed_calls_per_run() -> int:
    """The rollouts' exposed all-reduce calls in one run (the constants above)."""
    return round(
        ROLLOUTS_PER_RUN * ENGINES * PREFILL_FORWARDS * ALL_REDUCES_PER_FORWARD * EXPOSED_SHARE
    )


def implied_rate(spike_rate: float = SPIKE_RATE_PER_RUN, exposed: int | None = None) -> float:
    """The least per-call rate at which ``exposed`` calls per run hold a wrong sum in a fraction
    ``spike_rate`` of runs: ``-ln(1 - s) / E`` (module doc)."""
    _check_rate(spike_rate)
    calls = exposed_calls_per_run() if exposed is None else exposed
    return -math.log1p(-spike_rate) / calls


def calls_needed(p: float, confidence: float = CONFIDENCE) -> int:
    """``ceil(ln(1 - confidence) / ln(1 - p))`` (module doc)."""
    _check_rate(p)
    _check_rate(confidence)
    return math.ceil(math.log1p(-confidence) / math.log1p(-p))


def detection_probability(p: float, calls: int) -> float:
    """``1 - (1 - p)^calls``: the chance ``calls`` affected calls show a rate-``p`` fault."""
    _check_rate(p)
    return -math.expm1(calls * math.log1p(-p))


def rate_upper_bound(calls: int, confidence: float = CONFIDENCE) -> float | None:
    """The largest per-call rate that ``calls`` clean calls do not exclude; None for 0 calls."""
    if calls <= 0:
        return None
    return -math.expm1(math.log1p(-confidence) / calls)


def allocate(
    seconds_per_call: Sequence[float],
    affected: Sequence[bool],
    needed: int,
    control_share: float = CONTROL_SHARE,
    min_control_calls: int = MIN_CONTROL_CALLS,
) -> list[int]:
    """Calls per entry (module doc: equal time per affected size, a share for controls)."""
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


SGLANG_DEFAULT_CHUNKED_PREFILL = 16384  # sglang 0.5.16 server_args.py, gpu_mem >= 160 GiB
DTYPE_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}
UNIFORM_STEP = 64  # 90·N packs per rank is a multiple of 128 lanes iff N % 64 == 0 (TP 4)
CPU_MAX_TOKENS = 128
# The rollout conditions (docs/node.md, "Rollout conditions"), each an arm with its own calls.
ARMS = ("back_to_back", "gemm", "skew", "spread")
# SGLang's own CustomAllreduce takes inputs up to _MAX_CAR_SIZE = 2 * 8192 * 1024 bytes on HIP
# (sglang 0.5.16, python/sglang/srt/distributed/device_communicators/custom_all_reduce.py).
SGLANG_MAX_BYTES = 2 * 8192 * 1024


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


def _flag(argv: list[str], flag: str) -> str | None:
    """The value after the last ``flag`` (or ``flag=value``) in ``argv``."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def recipe_shape(recipe: Recipe) -> RecipeShape:
    """The shape (``docs/node.md``, "How the plan is built") from ``recipe``'s fields and argv."""
    argv = recipe.argv()
    hidden = _flag(argv, "--hidden-size")
    dtype = _flag(argv, "--sglang-dtype")
    chunk = _flag(argv, "--sglang-chunked-prefill-size")
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
        chunked_prefill_size=int(chunk) if chunk is not None else SGLANG_DEFAULT_CHUNKED_PREFILL,
    )


def sglang_decode_sizes(requests: int) -> list[int]:
    """The batch sizes SGLang's decode replays for up to ``requests`` requests: its CUDA-graph
    capture list (sglang ``server_args._generate_cuda_graph_batch_sizes``, no speculative
    decoding) up to the first size that holds ``requests`` (a batch pads up to it)."""
    ladder = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, 4097, 32)]
    sizes = []
    for bs in ladder:
        sizes.append(bs)
        if bs >= requests:
            break
    return sizes


@dataclass(frozen=True)
class LatencyModel:
    """Estimated seconds per call: kernel ``base_s + bytes / bytes_per_s`` plus the harness's
    own cost at ``N`` tokens (linear between the measured points), and where they come from."""

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


# The harness's whole blocks (inputs, calls, check) per call with the current worker: 4 ranks of
# canary.worker sharing one H200 over gloo, bf16, hidden 2880, a reducer that makes the exact sum
# locally (docs/node.md, "What a GPU run showed"). The 4 ranks time-share the GPU, so from
# N = 4095 (device-bound) the figures overstate a node with a GPU a rank by up to 4x.
H200_HARNESS_US = (
    (1, 90.0),
    (32, 81.0),
    (127, 86.0),
    (255, 108.0),
    (1023, 237.0),
    (4095, 858.0),
    (11650, 2361.0),
)
NODE_LATENCY = LatencyModel(
    base_s=12e-6,
    bytes_per_s=75e9,
    harness_us=H200_HARNESS_US,
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

    name: str
    latency: LatencyModel
    max_tokens: int | None
    control_share: float
    min_control_calls: int


NODE = Target("node", NODE_LATENCY, None, CONTROL_SHARE, MIN_CONTROL_CALLS)
CPU = Target("cpu", CPU_LATENCY, CPU_MAX_TOKENS, 0.02, 4)


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
    """The entries, the power they buy, and the time they are estimated to take."""

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
        """Estimated time of all calls, the TP groups running side by side."""
        hidden = self.shape.hidden
        total = sum(
            e.calls * self.latency.seconds(e.bytes, e.tokens)
            + dict(e.arms).get("gemm", 0) * (2.0 * e.tokens * hidden * hidden / GEMM_FLOPS)
            + dict(e.arms).get("skew", 0) * SKEW_S
            for e in self.entries
        )
        return total / self.groups


# The gemm arm's layer-shaped matmul, (N, hidden) x (hidden, hidden), at an assumed 300 TFLOP/s
# bf16, and the skew arm's delay of one rank per call (docs/node.md, "Rollout conditions").
GEMM_FLOPS = 300e12
SKEW_S = 20e-6


def token_sizes(
    shape: RecipeShape, constants: DispatchConstants, top: int, wave: int = CDNA_WAVE
) -> list[int]:
    """Decode as SGLang pads it, exposed prefill sizes and matched controls (``docs/node.md``,
    "How the plan is built"), ascending, deduplicated."""
    decode = [n for n in sglang_decode_sizes(shape.requests_per_engine) if n <= top]
    powers = []
    m = UNIFORM_STEP
    while m <= top:
        powers.append(m)
        m *= 2
    candidates = {top} | {p + d for p in powers for d in (-1, 1)} | set(powers)

    def cls(n: int) -> str:
        d = dispatch(shape.nbytes(n), shape.tp, shape.dtype_size, True, constants)
        return wave_class(d, shape.tp, wave)

    def find(start: int, step: int, wanted: str) -> int | None:
        n = start
        while shape.requests_per_engine < n <= top:
            if cls(n) == wanted:
                return n
            n += step
        return None

    first_exposed = find(shape.requests_per_engine + 1, 1, "exposed")
    picks = [
        first_exposed,
        find(top // 2, 1, "exposed"),
        find(shape.requests_per_engine + 1, 1, "early-no-read"),
        find((first_exposed or top + 1) - 1, -1, "early-no-read"),
    ]
    candidates |= {n for n in picks if n is not None}
    kept = {
        n
        for n in candidates
        if shape.requests_per_engine < n <= top
        and cls(n) in ("exposed", "early-no-read", "waves-agree", "uniform")
    }
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
    """The plan (``docs/node.md``, "How the plan is built"); ``tokens`` keeps only those sizes.
    ValueError for a detect rate outside (0, 1), a size outside the plan's range, or no size
    where a stale read is possible."""
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
    latency = target.latency
    calls = allocate(
        [latency.seconds(shape.nbytes(n), n) for n in sizes],
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
    return Plan(shape, constants, entries, detect_rate, latency, max(1, groups), wave_size)
