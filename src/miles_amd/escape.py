"""Strings from a run dir made safe for where they are shown: one function per sink.

A run dir is untrusted input: a TensorBoard tag, a ``job.json`` message, a log line or an
``env.json`` value may hold anything. Every such string passes through the function of the
sink it is written to:

- :func:`terminal`: text output and tables on a terminal (and the one-line stderr errors).
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

__all__ = ["markdown", "markdown_code", "terminal"]

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff]")
_MARKDOWN = re.compile(r"([\\`*\[\]|]|^#)")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(text: object) -> str:
    """``text`` with every control and bidi character shown as its escape (one line)."""
    return _CONTROL.sub(_escaped, str(text))


def markdown(text: object) -> str:
    """``text`` as inert inline markdown: see the module doc."""
    safe = terminal(" ".join(str(text).split()))
    safe = "".join(_HTML.get(char, char) for char in safe)
    return _MARKDOWN.sub(r"\\\1", safe)


def markdown_code(text: object) -> str:
    """``text`` as an inline code span (see the module doc)."""
    safe = terminal(" ".join(str(text).split()))
    return markdown(text) if "`" in safe or not safe else f"`{safe}`"
