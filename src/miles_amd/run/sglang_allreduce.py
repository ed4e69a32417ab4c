"""Which tensor-parallel all-reduce SGLang's rollout engines will use: SGLang's own rule.

Decides the route (:func:`allreduce_route`) from the env the job will see, the recipe's argv
and whether aiter's custom all-reduce module imports, in the order of SGLang's
``dispatch_custom_allreduce`` (``custom_all_reduce.py``, sglang 0.5.16):

- :data:`DISABLE_FLAG`: no custom all-reduce (RCCL only);
- ``SGLANG_USE_1STAGE_ALLREDUCE`` set: true takes SGLang's own 1-stage kernel, false ignores
  deterministic mode, any other value makes SGLang raise;
- unset and deterministic inference on (:data:`DETERMINISTIC_FLAGS`): SGLang's own 1-stage;
- ``SGLANG_USE_AITER_AR`` false: SGLang's own;
- otherwise aiter's when its module imports, else SGLang's own with a warning.

Pure; reads nothing. The probe that feeds it is ``run.probes_allreduce``. SGLang's source,
its env parsing and the log line of each route: ``docs/node.md`` ("SGLang's all-reduce
rule").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Route = Literal["aiter", "sglang", "none", "invalid"]

SGLANG_SOURCE = "sglang/srt/distributed/device_communicators/custom_all_reduce.py"
DETERMINISTIC_FLAGS = (
    "--sglang-enable-deterministic-inference",
    "--true-on-policy-mode",
    "--recompute-logprobs-via-prefill",
    "--sglang-rl-on-policy-target",
)
DISABLE_FLAG = "--sglang-disable-custom-all-reduce"
_ENV_TRUE, _ENV_FALSE = ("true", "1", "yes", "y"), ("false", "0", "no", "n")


@dataclass(frozen=True)
class AllreduceRoute:
    """The route and the one reason SGLang's rule gives for it."""

    route: Route
    reason: str

    def text(self) -> str:
        return f"{self.route}: {self.reason}"


def allreduce_route(
    env: Mapping[str, str], argv: Sequence[str], aiter_import_error: str | None
) -> AllreduceRoute:
    """SGLang's choice (module doc); ``aiter_import_error`` None when aiter's module imports."""
    if DISABLE_FLAG in argv:
        return AllreduceRoute("none", f"{DISABLE_FLAG}: no custom all-reduce (RCCL only)")
    one_stage = env.get("SGLANG_USE_1STAGE_ALLREDUCE")
    if one_stage is not None:
        value = one_stage.lower()
        if value in _ENV_TRUE:
            return AllreduceRoute("sglang", f"SGLANG_USE_1STAGE_ALLREDUCE={one_stage}: 1-stage")
        if value not in _ENV_FALSE:
            return AllreduceRoute(
                "invalid", f"SGLANG_USE_1STAGE_ALLREDUCE={one_stage!r} makes SGLang raise"
            )
    else:
        flags = [flag for flag in DETERMINISTIC_FLAGS if flag in argv]
        if flags:
            return AllreduceRoute("sglang", f"{flags[0]}: deterministic 1-stage all-reduce")
    aiter_ar = env.get("SGLANG_USE_AITER_AR", "true")
    if aiter_ar.lower() not in ("true", "1"):
        return AllreduceRoute("sglang", f"SGLANG_USE_AITER_AR={aiter_ar}")
    if aiter_import_error is not None:
        return AllreduceRoute(
            "sglang",
            "fallback: aiter.dist.device_communicators.custom_all_reduce does not import "
            f"({aiter_import_error})",
        )
    return AllreduceRoute("aiter", "AiterCustomAllreduce (SGLANG_USE_AITER_AR on, it imports)")
