"""Test and benchmark support that is not product: it does not ship in the wheel.

- ``rehearsal``: a replayed run through the real driver and gate, and what it must end in;
- ``two_node``: a two-node Ray cluster on one CPU machine;
- ``simulate``, ``honest``, ``calibrate``, ``intervals``: the noise models and the counting
  behind the gate's measured error rates (``benchmarks/bench_calibration.py``).

What the rehearsal's Ray job itself imports (the replay, its faults and writers) is package
code, ``miles_amd.testing``: the job runs with the installed package, not with this tree.
Benchmarks run as scripts put the repo root on ``sys.path`` to import this package.
"""
