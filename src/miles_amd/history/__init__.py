"""Run history: every gate verdict kept in a SQLite store, listed, plotted and checked for drift."""
