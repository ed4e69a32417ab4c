"""``max_within``: the run's max lies below the bound derived for N rollouts.

``center + (E[max of N normals] + k)·sd`` (``miles_amd.rules.bands.max_band``), raised to
cover the ``cover`` values; no lower bound. The shared check, derivation and validation are
``miles_amd.rules.band``'s. Pure: no file is read.
"""

from __future__ import annotations

from miles_amd.rules import band
from miles_amd.rules.check import Problem
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Rule

METHOD = "max_band"


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    return band.validate_band(rule, baseline, METHOD)


SPEC = KindSpec(
    name="max_within",
    params=band.BandParams,
    check=band.check_band,
    expected=band.expected_band,
    reference=band.reference_spread,
    validate=validate,
    derive_method=METHOD,
    rederive=band.rederive_band,
)
