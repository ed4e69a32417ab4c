"""Typed records of a run dir's JSON files (``job``, ``env``, ``plan``, ``canary``) and how
they are read (``model``: pydantic on their type hints). Writers and ``miles_amd.evidence``
(the one reader) share them; nothing here opens a file.
"""
