"""Strings from a run dir made safe for where they are shown: one function per sink.

A run dir is untrusted input: a TensorBoard tag, a ``job.json`` message, a log line or an
``env.json`` value may hold anything. Such a string is shown through the function of the sink
it is written to (a hostile ``job.json`` message stays inert in the gate's terminal output
and ``report.md``: ``tests/unit/test_untrusted_input.py``):

- :func:`terminal`: text output and tables on a terminal (and the
  one-line errors on stderr, ``miles_amd.cli.errors``).
  Control characters (C0, DEL, C1: ``ESC`` starts an ANSI sequence that recolours, moves the
  cursor or retitles the window; ``\\r`` overwrites what was printed) and the bidirectional
  overrides (``U+202A``-``U+202E``, ``U+2066``-``U+2069``, which reorder what a reader sees)
  are shown as Python escapes (``\\x1b``, ``\\u202e``), so what was there stays visible and
  nothing acts. A newline is escaped too: one value is one line.
- :func:`markdown`: inline text of ``report.md`` (CI appends it to the GitHub job summary,
  which renders markdown and some HTML). On top of :func:`terminal`, whitespace is folded,
  ``& < >`` become HTML entities (no tag, comment or entity survives) and the characters that
  open markdown constructs (a backslash, a backtick, ``* [ ] |``, and a leading ``#``) are
  backslash-escaped, so a value can neither end its table cell nor start a link, an image,
  a code span or a heading. :func:`markdown_code` shows a value (a path) as a code span, where
  markdown and HTML are not interpreted; one holding a backtick falls back to :func:`markdown`.

Decides nothing about content; a pure leaf.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["markdown", "markdown_code", "terminal", "unsafe_chars"]

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
    """``text`` as inert inline markdown: see the module doc."""
    safe = terminal(" ".join(str(text).split()))
    safe = "".join(_HTML.get(char, char) for char in safe)
    return _MARKDOWN.sub(r"\\\1", safe)


def markdown_code(text: object) -> str:
    """``text`` as an inline code span (see the module doc)."""
    safe = terminal(" ".join(str(text).split()))
    return markdown(text) if "`" in safe or not safe else f"`{safe}`"
