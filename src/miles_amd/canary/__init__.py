"""The all-reduce canary: does the rollout engines' all-reduce return exact sums at their shapes?

Modules, each with one job:

- ``kernel``: aiter's custom all-reduce at one size (kernel, grid, the stage-1 trip counts per
  lane and per wave), its constants (the installed aiter's source, else the pinned commit's)
  and whether a wrong element looks like ROCm/aiter#5694's stale read;
- ``plan``: the sizes, conditions and calls from the recipe, and the power they buy;
- ``worker``: one rank (torch imported there), the positive control's builds included;
- ``harness``: a run (the ranks as bounded processes, merged), the positive control's run,
  and writing ``canary.json`` (its model: ``miles_amd.records.canary``; its schema
  ``canary.schema.json``);
- ``node``: whether this machine can run the hardware canary.

Pure: ``kernel`` (but for reading the installed aiter's source) and ``plan``. What a result
proves: ``docs/node.md``.
"""
