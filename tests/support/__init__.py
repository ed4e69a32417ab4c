"""Test and benchmark support, not product (not in the wheel): the rehearsal's replayed run,
a two-node Ray cluster on one machine, and the noise models behind the gate's measured error
rates. What the rehearsal's Ray job imports is package code, ``miles_amd.testing``."""
