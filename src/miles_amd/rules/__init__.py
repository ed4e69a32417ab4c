"""Acceptance rules: a baseline's stored shape and every kind of rule, one module each.

The loader (``miles_amd.baseline``), the gate (``miles_amd.judge``) and the report
(``miles_amd.report``) build on it and it imports none of them
(``tests/unit/test_import_cycles.py``); it does import the shared leaves
(``miles_amd.evidence.types``, ``miles_amd.records``, ``miles_amd.numeric``).

- ``model``: ``Baseline``, ``RunShape`` and ``Rule`` with their JSON; ``Params``;
- ``bands``: the statistics tolerances are derived with; ``log_scale``: the reference's
  log-scale spread;
- ``check``: ``Check`` and ``RuleContext``; ``kind``: ``KindSpec``, what one kind declares;
- ``kinds/<kind>.py``: one module per kind; ``band``: what the two band kinds share;
- ``registry``: ``KINDS``, ``evaluate_rule`` (the whole run or a look), ``expected_text``,
  ``validate_rule``;
- ``looks``: a run's looks and each spending rule's boundaries; ``spending``: the
  alpha-spending function.

Plot hints are the report's (``miles_amd.report.rule_hints``). Adding a rule kind, step by
step: ``docs/gate-and-statistics.md`` ("Adding a rule kind").
"""
