"""Inert `triton` for the parse path: ../_inert_stub.py."""

from _inert_stub import make_inert

make_inert(__name__)
