"""What a node-less rehearsal's Ray job imports instead of miles' ``train.py``: the replay
(``python -m miles_amd.testing.replay``), its faults, miles' formats imitated (``miles_writer``)
or written by miles' own code (``real_writers``), and the embedded ``example-run/``. No product
module imports it (pyproject's import contracts); docs/rehearsal.md explains the rehearsal.
"""
