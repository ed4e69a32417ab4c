"""The application layer: what a command does with the pipeline, between the CLI and it.

- ``baselines``: loading a baseline and mapping its errors to one line; which shipped baseline
  each aiter variant is gated against; the rules the fail-fast watcher applies.
- ``gate``: read a run dir, judge it, render the report set and write it, then append it to a
  named history; where reports go by default; the embedded example ``gate --example`` uses.
- ``compare``: read two run dirs, compare them, write the comparison set.
- ``train``: run a plan with the driver (which runs and records, and does not judge), then gate
  it; the same for ``--variants`` with the A/B comparison.

The CLI and ``tests/mi355x`` call this layer; ``run/`` does not import it, ``judge/`` and
``report/`` do not either (pyproject's import contracts).
"""
