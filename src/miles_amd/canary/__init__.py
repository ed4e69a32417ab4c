"""The all-reduce canary: exact sums at the rollout shapes? ``docs/node.md``."""
