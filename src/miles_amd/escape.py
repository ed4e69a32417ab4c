"""Strings from a run dir made safe for where they are shown: one function per sink.
:func:`terminal` shows control, separator and format characters (ESC, ``\\r``, bidi
overrides) as Python escapes, one line; :func:`markdown` on top of that folds whitespace,
writes ``& < >`` as entities and backslash-escapes ``\\ ` * [ ] |`` and a leading ``#``, so a
value can neither end its table cell nor start a link, code span or heading;
:func:`markdown_code` is a code span, or :func:`markdown` for a value holding a backtick.
"""

from __future__ import annotations

import re
import unicodedata

_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_PLAIN = re.compile("[\x20-\x7e]*")  # printable ASCII: nothing to escape (the fast path)
_MARKDOWN = re.compile(r"([\\`*\[\]|]|^#)")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _UNSAFE_CATEGORIES


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def unsafe_chars(text: str) -> list[str]:
    """The characters of ``text`` that :func:`terminal` escapes, each as its escape."""
    if _PLAIN.fullmatch(text):
        return []
    return [_escaped(char) for char in text if _unsafe(char)]


def terminal(text: object) -> str:
    """``text`` with every control, format (bidi, zero-width) and separator character shown
    as its escape (one line)."""
    value = str(text)
    if _PLAIN.fullmatch(value):
        return value
    return "".join(_escaped(char) if _unsafe(char) else char for char in value)


def markdown(text: object) -> str:
    safe = terminal(" ".join(str(text).split()))
    safe = "".join(_HTML.get(char, char) for char in safe)
    return _MARKDOWN.sub(r"\\\1", safe)


def markdown_code(text: object) -> str:
    safe = terminal(" ".join(str(text).split()))
    return markdown(text) if "`" in safe or not safe else f"`{safe}`"
