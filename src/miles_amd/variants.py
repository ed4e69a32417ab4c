"""The aiter variants a run can be labelled with, and the SGLang env of each.

``stock`` is the aiter the image ships; ``patched`` is ROCm/aiter with the kernel fix of
pull request 5694 (block barriers of aiter's custom all-reduce; intermittent
``train/train_rollout_logprob_abs_diff`` spikes). Each has its own shipped baseline of the
same name (:data:`BASELINE_VARIANTS`). ``rccl`` is the control arm: aiter as installed, but
SGLang's tensor-parallel all-reduce is SGLang's own (``SGLANG_USE_AITER_AR=0``), so a spike
that survives it is not aiter's all-reduce. It has no published baseline: it is judged by
the gate's baseline-free checks and by ``miles-amd compare`` against a stock run of the same
node.

:func:`sglang_env` is what the job's runtime env sets for a variant (``recipe.plan``):
``SGLANG_USE_AITER=1`` for every variant (the image sets it too; the job no longer relies on
that), and
``SGLANG_USE_AITER_AR`` ``1`` for stock/patched (the A/B premise: the fix lives in aiter's
all-reduce) or ``0`` for rccl. Without a variant only ``SGLANG_USE_AITER`` is set. Decides
the names, their descriptions and those env values (``tests/unit/test_ab_premise.py``).

The all-reduce implementations a canary can test (the ``implementation`` a ``canary.json``
names) and which one a variant's rollouts use (:func:`rollout_implementation`): ``aiter``
(aiter's ``CustomAllreduce``, what SGLang's ``dispatch_custom_allreduce`` returns on ROCm with
``SGLANG_USE_AITER_AR`` on: ``run.sglang_allreduce``) for stock and patched; ``sglang``
(SGLang's own ``CustomAllreduce``) for rccl; ``rccl`` (``torch.distributed.all_reduce`` on the
RCCL group), the reference no variant's rollouts use at these sizes; ``reducer``, the CPU test
seam (``--reducer FILE:FUNCTION``).

Caveat: the names are spelled again where a CLI option lists its choices (``cli/canary.py``)
and where a variant picks its baseline (``app/baselines.py``).
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AITER_FIX",
    "AITER_VARIANTS",
    "BASELINE_VARIANTS",
    "IMPLEMENTATIONS",
    "AiterVariant",
    "Implementation",
    "aiter_allreduce_expected",
    "describe",
    "rollout_implementation",
    "sglang_env",
]

AiterVariant = Literal["stock", "patched", "rccl"]
AITER_VARIANTS: tuple[AiterVariant, ...] = ("stock", "patched", "rccl")
BASELINE_VARIANTS: tuple[AiterVariant, ...] = ("stock", "patched")  # one shipped baseline each
AITER_FIX = "ROCm/aiter#5694"
_DESCRIPTIONS: dict[str, str] = {
    "stock": f"stock (as shipped in the image, without {AITER_FIX})",
    "patched": f"patched (with the kernel fix {AITER_FIX})",
    "rccl": "rccl control arm (aiter as installed, SGLang's own all-reduce: SGLANG_USE_AITER_AR=0)",
}


def describe(variant: str) -> str:
    """One line for reports and recorded provenance; ``KeyError`` for an unknown name."""
    return _DESCRIPTIONS[variant]


def aiter_allreduce_expected(variant: str | None) -> bool:
    """Whether the variant's rollout all-reduce must be aiter's (every variant but rccl)."""
    return variant != "rccl"


def sglang_env(variant: str | None) -> dict[str, str]:
    """The SGLang aiter switches the job's runtime env sets for ``variant`` (see module doc)."""
    env = {"SGLANG_USE_AITER": "1"}
    if variant is not None:
        if variant not in AITER_VARIANTS:
            raise KeyError(variant)
        env["SGLANG_USE_AITER_AR"] = "1" if aiter_allreduce_expected(variant) else "0"
    return env


Implementation = Literal["aiter", "sglang", "rccl", "reducer"]
IMPLEMENTATIONS: tuple[Implementation, ...] = ("aiter", "sglang", "rccl", "reducer")


def rollout_implementation(variant: str) -> Implementation:
    """The all-reduce the rollouts of ``variant`` use; ``KeyError`` for an unknown variant."""
    if variant not in AITER_VARIANTS:
        raise KeyError(variant)
    return "aiter" if aiter_allreduce_expected(variant) else "sglang"
