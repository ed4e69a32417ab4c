"""The all-reduce canary: does the rollout engines' all-reduce return exact sums at their
shapes? ``kernel`` models aiter's dispatch, ``plan`` picks sizes and calls, ``worker`` is one
rank, ``harness`` runs and merges them, ``node`` checks the machine. ``docs/node.md``.
"""
