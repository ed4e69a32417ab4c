"""One module per rule kind, named as the kind (``"kind": "all_below"`` -> ``all_below.py``).

Every module here is a kind and defines ``SPEC`` (a :class:`miles_amd.rules.kind.KindSpec`);
``miles_amd.rules.registry`` finds them by listing this package. See ``miles_amd.rules`` for
how to add one.
"""
