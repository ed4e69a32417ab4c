"""Baseline files: their model and loading, band derivation, record and diff."""
