"""Showing a verdict: report.json, report.md, metrics.png, terminal text."""
