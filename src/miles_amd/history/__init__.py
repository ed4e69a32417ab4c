"""Run history: gate verdicts kept in a SQLite store, listed, plotted and checked for drift."""
