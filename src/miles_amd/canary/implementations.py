"""The all-reduce implementations a canary can test, and which one each variant's rollouts use.

Decides the labels a ``canary.json`` names (``implementation``) and the mapping the gate
compares them with:

- ``aiter``: aiter's ``CustomAllreduce`` (``aiter.dist.device_communicators.custom_all_reduce``),
  what SGLang's ``dispatch_custom_allreduce`` returns on ROCm with ``SGLANG_USE_AITER_AR`` on
  (``run.sglang_allreduce``): the rollouts of ``stock`` and ``patched``;
- ``sglang``: SGLang's own ``CustomAllreduce(cpu_group, device)``: the rollouts of ``rccl``,
  the control arm (``SGLANG_USE_AITER_AR=0``); it takes sizes up to :data:`SGLANG_MAX_BYTES`;
- ``rccl``: ``torch.distributed.all_reduce`` on the RCCL group: the reference no variant's
  rollouts use for these sizes;
- ``reducer``: the CPU test seam (``--reducer FILE:FUNCTION``); no variant's rollouts use it.
"""

from __future__ import annotations

from typing import Literal

from miles_amd import variants

Implementation = Literal["aiter", "sglang", "rccl", "reducer"]
IMPLEMENTATIONS: tuple[Implementation, ...] = ("aiter", "sglang", "rccl", "reducer")
NODE_IMPLEMENTATIONS: tuple[Implementation, ...] = ("aiter", "sglang", "rccl")
# SGLang's own CustomAllreduce takes inputs up to _MAX_CAR_SIZE = 2 * 8192 * 1024 bytes on HIP
# (sglang 0.5.16, python/sglang/srt/distributed/device_communicators/custom_all_reduce.py).
SGLANG_MAX_BYTES = 2 * 8192 * 1024


def rollout_implementation(variant: str) -> Implementation:
    """The all-reduce the rollouts of ``variant`` use; ``KeyError`` for an unknown variant."""
    if variant not in variants.AITER_VARIANTS:
        raise KeyError(variant)
    return "aiter" if variants.aiter_allreduce_expected(variant) else "sglang"
