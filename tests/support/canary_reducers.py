"""Reducers for ``miles-amd canary --reducer FILE:FUNCTION`` on CPU ranks (gloo): each takes
a rank's tensor and its TP group and returns the all-reduced tensor, or fails in one way.
Loaded by path in the ranks (never imported by the tests): torch is there.
"""

from __future__ import annotations

import importlib.util
import os
import random
import time
from typing import Any

import torch.distributed as dist

from miles_amd.canary.kernel import dispatch, early_waves, wave_class

# stale: with probability RATE per call (every rank draws from one seeded stream)
RATE = float(os.environ.get("CANARY_TEST_RATE", "0"))
_draws = random.Random(int(os.environ.get("CANARY_TEST_SEED", "0")))
_previous: dict[int, Any] = {}


def gloo(tensor: Any, group: Any) -> Any:
    """Clean: gloo's own all-reduce."""
    dist.all_reduce(tensor, group=group)
    return tensor


def _stale_elements(tokens: int, rank: int, tp: int) -> list[int]:
    d = dispatch(tokens * 2880 * 2, tp, 2)
    first, early = early_waves(d, d.part, d.threads_per_gpu * tp)
    out: list[int] = []
    for owner in range(tp):
        slot = (owner - rank) % tp
        for wave, reads in early.items():
            for thread in range(wave * 64, wave * 64 + 64):
                if reads and thread // d.threads_per_gpu == slot and owner != rank:
                    pack = owner * d.part + first + thread % d.threads_per_gpu
                    out += range(8 * pack, 8 * pack + 8)
    return out


def stale(tensor: Any, group: Any) -> Any:
    """Built like ROCm/aiter#5694's stale read: at the exposed sizes one rank's result keeps
    the previous call's sum where the kernel's early wave reads peer data (bf16 packs of 8)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    dist.all_reduce(tensor, group=group)
    hit = _draws.random() < RATE
    victim = _draws.randrange(world)
    tokens = tensor.shape[0]
    exposed = wave_class(dispatch(tokens * 2880 * 2, world, 2), world) == "exposed"
    last = _previous.get(tokens)
    _previous[tokens] = tensor.clone()
    if hit and exposed and rank == victim and last is not None:
        where = _stale_elements(tokens, rank, world)
        tensor.view(-1)[where] = last.view(-1)[where]
    return tensor


def hang(tensor: Any, group: Any) -> Any:
    time.sleep(3600)


def boom(tensor: Any, group: Any) -> Any:
    if dist.get_rank(group) == 1:
        raise RuntimeError("injected reducer failure")
    return gloo(tensor, group)


def quiet(tensor: Any, group: Any) -> Any:
    """Every rank exits 0 without a result; rank 0, the store's host, leaves last."""
    time.sleep(0.5 * (3 - dist.get_rank(group)))
    os._exit(0)


def first_row(tensor: Any, group: Any) -> Any:
    """The exact sum, but only its first row: the canary's rows are equal (2880 is a multiple
    of 15), so a check that broadcast it over (N, 2880) would read it clean."""
    return gloo(tensor, group)[:1]


def sees_aiter(tensor: Any, group: Any) -> Any:
    if importlib.util.find_spec("aiter") is None:  # found, never imported (it raises)
        raise RuntimeError("this rank does not see the aiter the canary fingerprinted")
    return gloo(tensor, group)
