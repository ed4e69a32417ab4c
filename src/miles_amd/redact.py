"""Secrets removed from text that others wrote, before it is printed or stored: the secret
variables' values, named values, ``NAME=value``, credential flags, ``Bearer`` tokens and a URL's
credentials become :data:`REDACTED`. What and where: ``docs/ray-head-and-secrets.md`` ("What is
redacted, and where").
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

from miles_amd.recipe.settings import secret_flags_in

REDACTED = "<redacted>"
SECRET_VARS = ("WANDB_API_KEY", "HF_TOKEN", "RAY_AUTH_TOKEN")
MIN_SECRET_LEN = 4
_BY_NAME = re.compile(
    r"(?P<key>\b(?:" + "|".join(SECRET_VARS) + r")\b['\"]?\s*[:=]\s*['\"]?)(?P<value>[^\s'\",}\]]+)"
)
_FLAG = re.compile(r"(?P<flag>--[A-Za-z0-9_-]+)(?P<sep>=|\s+)(?P<value>[^\s'\",}\]]+)")
_BEARER = re.compile(r"(?P<key>\bBearer\s+)(?P<value>[^\s'\",}\]]+)", re.IGNORECASE)
_USERINFO = re.compile(r"(?P<key>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<value>[^\s/?#@'\"]+)@")


def _values(extra: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    found = {environ.get(name, "") for name in SECRET_VARS} | {str(v) for v in extra}
    return sorted((v for v in found if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)


def _flag_value(match: re.Match[str]) -> str:
    if not secret_flags_in([match.group("flag")]):
        return match.group()
    return match.group("flag") + match.group("sep") + REDACTED


def redact(text: str, secrets: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret (module doc), ``secrets`` and the secret variables of
    ``environ`` (default ``os.environ``) among them, replaced by ``<redacted>``."""
    for value in _values(secrets, os.environ if environ is None else environ):
        text = text.replace(value, REDACTED)
    text = _BY_NAME.sub(lambda m: m.group("key") + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group("key") + REDACTED, text)
    text = _USERINFO.sub(lambda m: m.group("key") + REDACTED + "@", text)
    return _FLAG.sub(_flag_value, text)
