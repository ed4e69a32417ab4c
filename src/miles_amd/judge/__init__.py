"""Judging: one run's evidence against a baseline, rule by rule, into a verdict."""
