"""What a node-less rehearsal's Ray job imports: the replay that stands in for miles' train.py.

- ``replay`` (``python -m miles_amd.testing.replay``), the entry, with ``replay_argv`` (the
  recipe's argv read back), ``faults`` (the injected faults), ``miles_writer`` (miles' formats
  imitated) and ``real_writers`` (miles' own writer code);
- ``example-run/``: the embedded jvvnhop9 run, package data (``miles_amd.package_data``).

It ships so the job, run by Ray with the installed package, can import it. No product module
outside it imports it, and every module in it is reachable from the replay's imports
(``tests/unit/test_testing_package.py``). The harness around the job (``rehearse``, the
two-node cluster, the noise models) is ``tests/support``; docs/rehearsal.md explains the
rehearsal.
"""
