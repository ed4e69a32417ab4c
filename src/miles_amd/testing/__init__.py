"""Test support, not product: the replay that stands in for miles' train.py on CPU,
its fault catalogue, the evidence writers and the rehearsal harness."""
