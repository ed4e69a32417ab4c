"""``max_within``: the run's max lies below the bound derived for N rollouts.

``center + (E[max of N normals] + k)·sd`` (``miles_amd.rules.bands.max_band``), raised to
cover the ``cover`` values; no lower bound. The shared check, derivation and validation are
``miles_amd.rules.bands``'. Pure: no file is read.
"""

from __future__ import annotations

from miles_amd.rules import bands

METHOD = "max_band"
SPEC = bands.band_spec("max_within", METHOD)
