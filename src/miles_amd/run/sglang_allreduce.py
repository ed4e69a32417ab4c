"""Which tensor-parallel all-reduce SGLang's rollout engines will use: SGLang's own rule.

Decides, from the env the job will see, the recipe's argv and whether aiter's custom
all-reduce module imports, the route SGLang takes on ROCm. The rule is SGLang's
``dispatch_custom_allreduce`` and ``_use_amd_deterministic_impl`` in
``python/sglang/srt/distributed/device_communicators/custom_all_reduce.py`` (sglang 0.5.16,
the CPU conformance env's SGLang; the image builds radixark's ``sglang-miles`` branch, whose
file the node's job log confirms: ``miles_amd.judge.allreduce``), in its order:

1. no custom all-reduce at all with ``disable_custom_all_reduce`` (``--sglang-disable-custom-
   all-reduce``; ``parallel_state.GroupCoordinator`` only builds one when it is off);
2. ``SGLANG_USE_1STAGE_ALLREDUCE`` set: true (``EnvBool``: true/1/yes/y) takes SGLang's own
   1-stage kernel; false ignores deterministic mode; any other value makes SGLang raise;
3. unset and deterministic inference on (``ServerArgs.enable_deterministic_inference``, which
   miles sets from ``--sglang-enable-deterministic-inference``, ``--true-on-policy-mode`` and
   ``--recompute-logprobs-via-prefill``, and SGLang from ``--sglang-rl-on-policy-target``):
   SGLang's own 1-stage kernel;
4. ``SGLANG_USE_AITER_AR`` (``get_bool_env_var``, default ``"true"``; only true/1 are true,
   anything else is false): false takes SGLang's own;
5. ``from aiter.dist.device_communicators.custom_all_reduce import CustomAllreduce``: it
   imports, aiter's (logged ``[AR] Using AiterCustomAllreduce (AMD default)``); it does not,
   SGLang's own with a warning (``[AR] Aiter custom all-reduce not available; falling back to
   sglang CustomAllreduce``).

Pure; reads nothing. The probe that feeds it is ``run.probes_allreduce``.

Explained for people in ``docs/node.md``.
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
