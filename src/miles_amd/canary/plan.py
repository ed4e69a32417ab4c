"""The canary's plan: which all-reduce sizes, how many calls each, and what the budget proves.

Decides, purely, from the recipe and the dispatch constants:

- **Shape** (:func:`recipe_shape`): hidden size, dtype, rollout TP, engines, requests per
  engine (the largest decode batch) and the prefill chunk; ``N`` tokens all-reduce
  ``N x hidden`` elements;
- **Sizes** (:func:`token_sizes`): every decode ``N``; prefill ``N`` of the suspect class up
  to the largest aiter's custom all-reduce takes; the uniform 2-stage sizes as controls;
- **Calls**: enough for the detect rate over the affected sizes (``power``), spread by a
  per-call time model (:class:`LatencyModel`) for a :class:`Target` (:data:`NODE` or
  :data:`CPU`); ``tokens`` narrows a plan to chosen sizes;
- **Groups**: the node's TP groups share each size's calls; the time estimate divides by them;
- SGLang's own all-reduce (the control arm) stops at its 16 MiB limit
  (:data:`SGLANG_MAX_BYTES`);
- each entry names the implementation tested and aiter's dispatch for its size.

The recipe's figures, the targets' settings and SGLang's sources: ``docs/node.md`` ("How the
plan is built").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from miles_amd.canary import power
from miles_amd.canary.dispatch import PINNED, DispatchConstants, dispatch, uses_custom_ar
from miles_amd.recipe.settings import Recipe

SGLANG_DEFAULT_CHUNKED_PREFILL = 16384  # sglang 0.5.16 server_args.py, gpu_mem >= 160 GiB
DTYPE_SIZES = {"bfloat16": 2, "float16": 2, "float32": 4}
UNIFORM_STEP = 64  # 90·N packs per rank is a multiple of 128 lanes iff N % 64 == 0 (TP 4)
CPU_MAX_TOKENS = 128
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

    def as_dict(self) -> dict[str, object]:
        return {
            "hidden": self.hidden,
            "dtype": self.dtype,
            "tp": self.tp,
            "engines": self.engines,
            "requests_per_engine": self.requests_per_engine,
            "chunked_prefill_size": self.chunked_prefill_size,
        }


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


@dataclass(frozen=True)
class LatencyModel:
    """Estimated seconds per call: ``base_s + bytes / bytes_per_s``, and where it comes from."""

    base_s: float
    bytes_per_s: float
    source: str

    def seconds(self, nbytes: int) -> float:
        return self.base_s + nbytes / self.bytes_per_s


NODE_LATENCY = LatencyModel(
    base_s=20e-6,
    bytes_per_s=75e9,
    source=(
        "published, not measured here: aiter/SGLang custom all-reduce at TP 4, 14.4 us at "
        "256 KB and 118.3 us at 8 MB (sgl-project/sglang#6619, MI300-class), aiter's 2-stage "
        "at world size 4 620.8 us for 2040x8192 fp32 (ROCm/FlyDSL#326); modelled as 12 us + "
        "bytes / 75 GB/s plus 8 us of harness per call (assumed)"
    ),
)
CPU_LATENCY = LatencyModel(
    base_s=2e-3,
    bytes_per_s=1.0e9,
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


NODE = Target("node", NODE_LATENCY, None, power.CONTROL_SHARE, power.MIN_CONTROL_CALLS)
CPU = Target("cpu", CPU_LATENCY, CPU_MAX_TOKENS, 0.02, 2)


@dataclass(frozen=True)
class PlanEntry:
    """One size of the plan."""

    tokens: int
    bytes: int
    kernel: str
    naive: bool
    uniform_trip_count: bool
    affected: bool
    blocks: int
    role: str  # decode, prefill, control
    calls: int
    implementation: str

    def as_dict(self) -> dict[str, object]:
        return {
            "tokens": self.tokens,
            "bytes": self.bytes,
            "kernel": self.kernel,
            "naive": self.naive,
            "uniform_trip_count": self.uniform_trip_count,
            "affected": self.affected,
            "blocks": self.blocks,
            "role": self.role,
            "calls": self.calls,
            "implementation": self.implementation,
        }


@dataclass(frozen=True)
class Plan:
    """The entries, the power they buy, and the time they are estimated to take."""

    shape: RecipeShape
    constants: DispatchConstants
    entries: tuple[PlanEntry, ...]
    detect_rate: float
    latency: LatencyModel
    groups: int

    @property
    def affected_calls(self) -> int:
        return sum(e.calls for e in self.entries if e.affected)

    @property
    def probability(self) -> float:
        return power.detection_probability(self.detect_rate, self.affected_calls)

    @property
    def estimated_seconds(self) -> float:
        """Estimated time of all calls, the TP groups running side by side."""
        total = sum(e.calls * self.latency.seconds(e.bytes) for e in self.entries)
        return total / self.groups


def top_tokens(
    shape: RecipeShape, constants: DispatchConstants, max_tokens: int, max_bytes: int | None
) -> int:
    """The largest ``N`` the plan may hold: within the chunk, ``max_tokens``, the custom
    all-reduce's size limit and ``max_bytes``."""
    top = min(max_tokens, shape.chunked_prefill_size)
    limit = min(constants.car_max_size, max_bytes or constants.car_max_size)
    while top > 0 and not (
        uses_custom_ar(shape.nbytes(top), constants) and shape.nbytes(top) <= limit
    ):
        top -= 1
    return top


def token_sizes(shape: RecipeShape, constants: DispatchConstants, top: int) -> list[int]:
    """Decode, prefill spread and uniform controls (``docs/node.md``, "How the plan is built"),
    ascending, deduplicated."""
    decode = range(1, min(shape.requests_per_engine, top) + 1)
    uniform = []
    m = UNIFORM_STEP
    while m <= top:
        uniform.append(m)
        m *= 2
    prefill = {shape.requests_per_engine + 1, top} | {u + d for u in uniform for d in (-1, 1)}
    spread = {
        n
        for n in prefill
        if shape.requests_per_engine < n <= top
        and dispatch(shape.nbytes(n), shape.tp, shape.dtype_size, True, constants).affected
    }
    return sorted(set(decode) | spread | set(uniform))


def build_plan(
    shape: RecipeShape,
    implementation: str,
    detect_rate: float,
    *,
    target: Target = NODE,
    constants: DispatchConstants = PINNED,
    groups: int = 1,
    tokens: Sequence[int] = (),
) -> Plan:
    """The plan (``docs/node.md``, "How the plan is built"); ``tokens`` keeps only those sizes.
    ValueError for a detect rate outside (0, 1), a size outside the plan's range, or no size of
    the suspect class."""
    needed = power.calls_needed(detect_rate)
    max_bytes = SGLANG_MAX_BYTES if implementation == "sglang" else None
    top = top_tokens(shape, constants, target.max_tokens or shape.chunked_prefill_size, max_bytes)
    sizes = token_sizes(shape, constants, top)
    if tokens:
        outside = sorted({n for n in tokens if not 1 <= n <= top})
        if outside:
            raise ValueError(f"tokens {outside} are outside this plan's 1..{top}")
        sizes = sorted(set(tokens))
    shapes = [dispatch(shape.nbytes(n), shape.tp, shape.dtype_size, True, constants) for n in sizes]
    if not any(d.affected for d in shapes):
        raise ValueError(
            f"none of the sizes {sizes} is in the suspect class (2-stage, non-uniform)"
        )
    latency = target.latency
    calls = power.allocate(
        [latency.seconds(shape.nbytes(n)) for n in sizes],
        [d.affected for d in shapes],
        needed,
        target.control_share,
        target.min_control_calls,
    )
    entries = tuple(
        PlanEntry(
            tokens=n,
            bytes=shape.nbytes(n),
            kernel=d.kernel,
            naive=d.naive,
            uniform_trip_count=d.uniform_trip_count,
            affected=d.affected,
            blocks=d.blocks,
            role="decode"
            if n <= shape.requests_per_engine
            else "control"
            if d.uniform_trip_count
            else "prefill",
            calls=c,
            implementation=implementation,
        )
        for n, d, c in zip(sizes, shapes, calls, strict=True)
    )
    return Plan(shape, constants, entries, detect_rate, latency, max(1, groups))
