"""The aiter variants a run can be labelled with (stock, patched, rccl), the SGLang env of
each, the all-reduce a canary tests for it, and which aiter its processes import (one rule,
:func:`aiter_pythonpath`). ``docs/node.md`` ("The aiter variants").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

AiterVariant = Literal["stock", "patched", "rccl"]
AITER_VARIANTS: tuple[AiterVariant, ...] = get_args(AiterVariant)
BASELINE_VARIANTS: tuple[AiterVariant, ...] = ("stock", "patched")  # one shipped baseline each
AITER_FIX = "ROCm/aiter#5694"
PATCHED_DIR_VAR = "AITER_PATCHED_DIR"
_DESCRIPTIONS: dict[str, str] = {
    "stock": f"stock (as shipped in the image, without {AITER_FIX})",
    "patched": f"patched (with the kernel fix {AITER_FIX})",
    "rccl": "rccl control arm (aiter as installed, SGLang's own all-reduce: SGLANG_USE_AITER_AR=0)",
}


def describe(variant: str) -> str:
    """One line for reports; ``KeyError`` for an unknown name."""
    return _DESCRIPTIONS[variant]


def aiter_allreduce_expected(variant: str | None) -> bool:
    """Whether the variant's rollout all-reduce must be aiter's (every variant but rccl)."""
    return variant != "rccl"


def sglang_env(variant: str | None) -> dict[str, str]:
    """The SGLang aiter switches of the job's runtime env."""
    env = {"SGLANG_USE_AITER": "1"}
    if variant is not None:
        if variant not in AITER_VARIANTS:
            raise KeyError(variant)
        env["SGLANG_USE_AITER_AR"] = "1" if aiter_allreduce_expected(variant) else "0"
    return env


Implementation = Literal["aiter", "sglang", "rccl", "reducer", "control", "control-broken"]
IMPLEMENTATIONS: tuple[Implementation, ...] = get_args(Implementation)


def rollout_implementation(variant: str) -> Implementation:
    """The rollouts' all-reduce; ``KeyError`` for an unknown variant."""
    if variant not in AITER_VARIANTS:
        raise KeyError(variant)
    return "aiter" if aiter_allreduce_expected(variant) else "sglang"


def aiter_dir(variant: str | None, env: Mapping[str, str]) -> str | None:
    """``AITER_PATCHED_DIR`` for a ``patched`` run; None: site-packages' aiter."""
    return (env.get(PATCHED_DIR_VAR) or None) if variant == "patched" else None


def aiter_pythonpath(variant: str | None, env: Mapping[str, str], *first: str) -> str:
    """``first`` (checkouts that hold no aiter), :func:`aiter_dir`, then ``env``'s own."""
    parts = (*first, aiter_dir(variant, env) or "", env.get("PYTHONPATH", ""))
    return ":".join(p for p in parts if p)


def aiter_origin(variant: str | None, env: Mapping[str, str]) -> str:
    """Where a ``variant`` process imports aiter from, in one line."""
    patched = aiter_dir(variant, env)
    if patched:
        return f"{PATCHED_DIR_VAR}={patched}, first on PYTHONPATH"
    unset = f"; {PATCHED_DIR_VAR} unset" if variant == "patched" else ""
    return f"site-packages (the image's aiter, or one pip installed there){unset}"
