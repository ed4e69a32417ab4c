"""``mean_within``: the run's mean lies in the band derived for N rollouts.

``center ± k·sd·sqrt(1/N + 1/n_ref)`` (``miles_amd.rules.bands.mean_band``), widened to
cover the ``cover`` values; the shared check, derivation and validation are
``miles_amd.rules.bands``'. Pure: no file is read.
"""

from __future__ import annotations

from miles_amd.rules import bands

METHOD = "mean_band"
SPEC = bands.band_spec("mean_within", METHOD)
