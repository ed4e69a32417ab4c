"""Which tokens of an argv pass a credential, in every spelling argparse would accept.

Decides what ``--extra-args`` may not carry: a flag whose value is a credential. An argv is
visible to every user of the host (``ps``), in Ray's job table and in the printed plan, so
such a flag is refused before anything runs, and the refusal names the flag only, not
``=value`` or the next token (``tests/unit/test_untrusted_input.py``). The W&B key reaches the job
as ``WANDB_API_KEY``.

The credential flags: miles' only one is ``--wandb-key`` (``miles/utils/arguments.py``);
``--wandb-api-key``, ``--api-key`` and ``--hf-token`` are refused too, and the suffix pattern
catches SGLang's ``--api-key`` passed through as ``--sglang-api-key`` and any
``--*-token``/``--*-secret``/``--*-password``-like flag. Megatron's ``--fim-*-token`` flags
name vocabulary tokens, not credentials, and stay allowed.

The spellings refused, each a way the value could reach miles' argv:

- ``--flag value`` and ``--flag=value`` (argparse splits the ``=`` form itself);
- any case, and underscores for dashes (``--WANDB_KEY``): argparse would reject them as
  unknown, but only after the value sat in the argv;
- an abbreviation: a prefix of a credential flag that reaches its last word (``--wandb-k``,
  ``--hf-t``, ``--sglang-api-k``; shorter prefixes are ambiguous to argparse and an ending
  like ``-t`` is too common to refuse). The pinned miles parses with Megatron's
  ``ArgumentParser(allow_abbrev=False)``
  (``megatron/training/arguments.py``), yet its ``parse_args_train_backend`` pre-parse uses a
  default parser (``allow_abbrev=True``) on the same argv, and a later miles may drop it.
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
