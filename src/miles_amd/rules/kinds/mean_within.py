"""``mean_within``: the run's mean lies in the band derived for N rollouts.

``center ± k·sd·sqrt(1/N + 1/n_ref)`` (``miles_amd.rules.bands.mean_band``), widened to
cover the ``cover`` values; the shared check, derivation and validation are
``miles_amd.rules.band``'s. Pure: no file is read.
"""

from __future__ import annotations

from miles_amd.rules import band
from miles_amd.rules.check import Problem
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Rule

METHOD = "mean_band"


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    return band.validate_band(rule, baseline, METHOD)


SPEC = KindSpec(
    name="mean_within",
    params=band.BandParams,
    check=band.check_band,
    expected=band.expected_band,
    reference=band.reference_spread,
    validate=validate,
    derive_method=METHOD,
    rederive=band.rederive_band,
)
