"""Acceptance rules: a baseline's stored shape and every kind of rule, one module each.

The loader (``miles_amd.baseline``), the gate (``miles_amd.judge``) and the report
(``miles_amd.report``) build on it and it imports none of them
(``tests/unit/test_import_cycles.py``); it does import the shared leaves
(``miles_amd.evidence.types``, ``miles_amd.records``, ``miles_amd.numeric``).

- ``model``: :class:`~miles_amd.rules.model.Baseline`, ``RunShape`` and ``Rule`` with
  ``to_json``/``from_json`` (a baseline file's JSON spelling), ``Params`` (the base of a
  kind's fields);
- ``bands``: the statistics tolerances are derived with (spread, bands, paired effect);
- ``log_scale``: the reference's log-scale spread, for the kinds that judge logarithms;
- ``check``: what a judged rule returns (``Check``) and what it reads (``RuleContext``);
- ``kind``: ``KindSpec``, what one kind declares;
- ``kinds/<kind>.py``: one module per kind (its params, check, expected sentence,
  validation, tolerance derivation), ``band``: what the two band kinds share;
- ``registry``: ``KINDS`` (every module of ``kinds``), ``evaluate_rule`` (the whole run or
  a look), ``expected_text``, ``validate_rule``;
- ``looks``: a run's looks and each spending rule's boundaries; ``spending``: the
  alpha-spending function and the boundaries that spend it.

Plot hints (what a kind draws on its metric's panel of ``metrics.png``) are the report's:
``miles_amd.report.rule_hints``.

How to add a rule kind ``my_kind``:

1. Write ``src/miles_amd/rules/kinds/my_kind.py`` (copy ``all_below.py``): a frozen
   dataclass ``MyKindParams(Params)`` whose fields are the rule's JSON keys beyond ``id``,
   ``kind``, ``metric``, ``required``, ``rationale`` and ``derivation`` (override
   ``from_json``/``to_json`` only for a field that is not a plain JSON value, as
   ``band.BandParams`` does); ``check`` (rule, the metric's non-empty series, context ->
   ``Check``; build it with ``check.rule_check``); ``expected`` (one sentence); and, as
   the kind needs, ``validate`` (a tolerance derived or bounded, so an absurd baseline is
   refused), ``reference``, ``summary``, ``rederive``, and how it is judged at a look
   (``looks``: ``at_once``, ``final``, or ``spending`` with its ``information`` and
   ``nominal`` rate, its check reading the look's bound from ``RuleContext.limit``); then
   ``SPEC = KindSpec(name="my_kind", params=MyKindParams, ...)``. The registry finds it.
2. Add ``my_kind`` to the ``kind`` enum of ``src/miles_amd/baseline/baseline.schema.json``,
   its fields to the rule's ``properties`` (with a description: how the value is derived
   or why it is bounded), and an ``allOf`` entry requiring them for ``my_kind`` (a
   ``spending`` kind in the entry requiring ``boundaries`` too).
   ``tests/unit/test_rule_registry.py`` fails until kinds and fields agree both ways.
3. Optionally, a plot hint in ``miles_amd.report.rule_hints.HINTS``.
"""
