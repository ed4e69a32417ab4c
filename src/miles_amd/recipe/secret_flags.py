"""Which tokens of an argv pass a credential, in every spelling argparse would accept (``--flag
value``, ``--flag=value``, any case, ``_`` for ``-``, an abbreviation that reaches the last word);
``--extra-args`` may not carry one. ``docs/ray-head-and-secrets.md`` ("Credential flags in
--extra-args").
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["SECRET_FLAGS", "secret_flags_in"]

SECRET_FLAGS = frozenset({"--wandb-key", "--wandb-api-key", "--api-key", "--hf-token"})
_SECRET_WORD = r"(api-key|token|secret|password|passwd|credentials?)"
_SECRET_FLAG_PATTERN = re.compile(rf"^--[a-z0-9-]*-(?:{_SECRET_WORD}|api-ke?)$")
_NON_SECRET_TOKEN_FLAGS = frozenset(
    {
        "--fim-eod-token",
        "--fim-middle-token",
        "--fim-pad-token",
        "--fim-prefix-token",
        "--fim-suffix-token",
    }
)
_ABBREVIATIONS = frozenset(
    flag[:end] for flag in SECRET_FLAGS for end in range(flag.rindex("-") + 2, len(flag) + 1)
)  # each prefix argparse accepts once it reaches the last word (one letter or more)


def normalised(token: str) -> str | None:
    """The flag name a token spells, as argparse would compare it loosely: lower case,
    dashes for underscores, ``=value`` dropped; None for a token that is no long flag."""
    if not token.startswith("--") or len(token) < 3:
        return None
    return token.split("=", 1)[0].lower().replace("_", "-")


def secret_flags_in(argv: Sequence[str]) -> list[str]:
    """The flags of ``argv`` (as written, ``=value`` dropped) that carry a credential."""
    found = set()
    for token in argv:
        name = normalised(token)
        if name is None or name in _NON_SECRET_TOKEN_FLAGS:
            continue
        if name in _ABBREVIATIONS or _SECRET_FLAG_PATTERN.match(name):
            found.add(token.split("=", 1)[0])
    return sorted(found)
