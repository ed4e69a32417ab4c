"""The all-reduce canary: does the rollout engines' all-reduce return exact sums at their shapes?

Modules, each with one job:

- ``dispatch``: aiter's custom all-reduce dispatch at one size (kernel, grid, whether the
  stage-1 trip counts are uniform per lane and per 64-lane wave), from ROCm/aiter's source;
- ``source``: the dispatch constants of the installed aiter, else the pinned commit's;
- ``power``: the call budget as detection power, and the rate the spikes imply;
- ``fingerprint``: whether a wrong element looks like ROCm/aiter#5694's stale read;
- ``plan``: the sizes and calls, from the recipe (``--plan``);
- ``worker`` (one rank), ``launch`` (the ranks as processes, bounded), ``harness`` (a run, merged);
- ``node``: whether this machine can run the hardware canary;
- ``record``: writing ``canary.json`` (its model: ``miles_amd.records.canary.CanaryRecord``)
  and its schema ``canary.schema.json``.

Pure except ``worker``, ``launch``, ``harness``, ``node`` and ``record.write_canary``; torch is
imported by ``worker``, in the ranks. What a result proves: ``docs/node.md``.
"""
