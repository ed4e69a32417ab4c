"""Acceptance rules: a baseline's stored shape and every kind of rule.

Below ``miles_amd.baseline``, ``miles_amd.judge`` and ``miles_amd.report``: ``model`` (the
baseline and its JSON), ``check`` (``Check``, ``RuleContext``), ``bands`` (the statistics
tolerances are derived with), ``kinds`` (every kind and ``KINDS``), ``registry`` (judging one
rule), ``looks`` and ``spending`` (sequential looks). Adding a rule kind:
``docs/gate-and-statistics.md`` ("Adding a rule kind").
"""
