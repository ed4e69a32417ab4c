"""Inert stand-in for `torchvision` on the parse path only: see ../_inert_stub.py."""

from _inert_stub import make_inert

make_inert(__name__)
