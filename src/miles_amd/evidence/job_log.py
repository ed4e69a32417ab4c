"""The Ray job log (``job.log``): streamed in bounded memory, its metric lines read safely.

:func:`line_blocks` yields blocks of whole lines with their first line's number (``\\n``
only, as ``grep -n``), a line over :data:`MAX_LINE` bytes in pieces, none skipped.
:class:`MetricLines` reads miles' ``step|rollout|perf <n>: {...}`` dicts without evaluating
anything; an unreadable one, or a metric at one step with two values, is a
:class:`MetricsFormatError` naming the line. The format, cuts and costs: ``docs/cli.md``
("How the gate reads a run dir").
"""

from __future__ import annotations

import ast
import math
import re
import struct
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import BinaryIO, TextIO

from miles_amd.evidence.types import (
    Columns,
    MetricsFormatError,
    SeriesMap,
    columns_to_series,
    new_columns,
)

CHUNK = 1 << 20  # bytes read at a time
MAX_LINE = 1 << 20  # bytes of one line (or one piece of a longer line) yielded at a time
OVERLAP = 4096  # bytes a hard-cut piece repeats of the previous one (> any signature)
METRIC_MESSAGES = ("step", "rollout", "perf")

_METRIC_LINE = re.compile(
    rf"\] [\w.-]+:\d+ - (?:{'|'.join(METRIC_MESSAGES)}) (-?\d+): (\{{.*)$", re.MULTILINE
)
_RAY_REPEAT = re.compile(r" \[repeated \d+x across cluster\]")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUMBER = r"-?(?:[0-9][0-9.e+-]*|inf|nan)"
# more signs in a row than any repr prints: refused before ``ast`` (200,000 were a MemoryError)
_SIGN_RUN = re.compile(r"(?:[-+~]\s*){16,}")
_PLAIN_ITEM = rf"'[^'\\\n]*': {_NUMBER}"
_PLAIN_DICT = re.compile(rf"\{{(?:{_PLAIN_ITEM}(?:, {_PLAIN_ITEM})*)?\}}")
_PLAIN_ITEMS = re.compile(rf"'([^'\\\n]*)': ({_NUMBER})")
_NUMPY_SCALARS = frozenset(
    {"float16", "float32", "float64", "longdouble", "int8", "int16", "int32", "int64"}
    | {"uint8", "uint16", "uint32", "uint64", "bool_", "bool"}
)
_NUMPY_NARROW_FLOATS = {"float32": "<f", "float16": "<e"}
_NON_FINITE_NAMES = {"nan": math.nan, "inf": math.inf}

MIN_BYTES = 64 << 20
INTERVAL_S = 0.5


class Progress:
    """``label: N% of M MB`` of a long read, one line rewritten in place at most every
    :data:`INTERVAL_S` and cleared at the end, only on a TTY and for :data:`MIN_BYTES` or more."""

    def __init__(self, label: str, total: int, stream: TextIO | None = None) -> None:
        self.label, self.total = label, total
        self.stream = stream if stream is not None else sys.stderr
        try:
            self.on = self.stream.isatty() and total >= MIN_BYTES
        except (AttributeError, ValueError):  # a closed or replaced stream
            self.on = False
        self.last, self.width = 0.0, 0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.on or now - self.last < INTERVAL_S:
            return
        self.last = now
        text = f"{self.label}: {100 * done // max(self.total, 1)}% of {self.total >> 20} MB"
        self._write("\r" + text.ljust(self.width))
        self.width = len(text)

    def close(self) -> None:
        if self.on and self.width:
            self._write("\r" + " " * self.width + "\r")
            self.width = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a terminal gone: the read goes on
            self.on = False


def line_blocks(handle: BinaryIO, size: int, *, live: bool = False) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each block of whole lines of the first ``size`` bytes of
    ``handle``, and each piece of an over-long line (module doc); a long read on a terminal
    shows progress (never a live one)."""
    name = getattr(handle, "name", None)  # an fd's handle is named by its number
    progress = Progress(
        f"reading {name if isinstance(name, str) else 'job.log'}", 0 if live else size
    )
    line, carry, remaining = 1, b"", size  # carry: the start of a line whose end is not read
    try:
        while remaining > 0:
            data = handle.read(min(CHUNK, remaining))
            if not data:
                break
            remaining -= len(data)
            progress.update(size - remaining)
            end = data.rfind(b"\n")
            if end < 0:
                carry += data
                while len(carry) > MAX_LINE:
                    cr = carry.rfind(b"\r", 0, MAX_LINE)
                    cut, keep = (cr + 1, cr + 1) if cr >= 0 else (MAX_LINE, MAX_LINE - OVERLAP)
                    yield line, carry[:cut].decode("utf-8", errors="replace")
                    carry = carry[keep:]
                continue
            block = carry + data[: end + 1]
            carry = data[end + 1 :]
            yield line, block.decode("utf-8", errors="replace")
            line += block.count(b"\n")
        if carry and not live:
            yield line, carry.decode("utf-8", errors="replace")
    finally:
        progress.close()


class MetricLines:
    """The metric lines of one log, fed in order as blocks (:func:`line_blocks`); memory grows
    with the points found, and a repeated line costs O(keys)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._points: defaultdict[str, Columns] = defaultdict(new_columns)
        self._first_at_step: dict[int, dict[str, tuple[float, int]]] = {}  # value, its line

    def feed(self, first_line: int, text: str) -> None:
        """Read the metric lines of ``text``, whose first line is line ``first_line``."""
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        line_number, counted_to = first_line, 0
        for match in _METRIC_LINE.finditer(text):
            line_number += text.count("\n", counted_to, match.start())
            counted_to = match.start()
            try:
                step = int(match.group(1))
                values = parse_metric_dict(match.group(2))
            except ValueError as error:
                reason = f"unreadable metric line: {error}"
                raise MetricsFormatError(self.path, line_number, reason) from None
            first = self._first_at_step.setdefault(step, {})
            for key, value in values.items():
                earlier = first.get(key)
                if earlier is None:
                    first[key] = (value, line_number)
                    columns = self._points[key]
                    columns[0].append(step)
                    columns[1].append(value)
                elif not (earlier[0] == value or (value != value and earlier[0] != earlier[0])):
                    raise MetricsFormatError(
                        self.path,
                        line_number,
                        f"{key!r} at step {step} is {value!r} here but {earlier[0]!r} at line "
                        f"{earlier[1]} (two runs in one log? keep one run per job.log)",
                    )

    def series(self) -> SeriesMap:
        return columns_to_series(self._points)


def parse_metric_dict(text: str) -> dict[str, float]:
    """The scalars of one metric dict repr (the rest of its line); ``ValueError`` if unreadable:
    a regex for plain numbers, the ``ast`` walker for the rest, each exactly as Python reads."""
    text = text.rstrip()
    repeat = text.rfind(" [repeated ")
    if repeat > 0 and _RAY_REPEAT.fullmatch(text, repeat):
        text = text[:repeat].rstrip()
    if _PLAIN_DICT.fullmatch(text):
        plain = {}
        for key, token in _PLAIN_ITEMS.findall(text):
            try:
                number = float(token)
            except ValueError:  # "1.2.3": the strict parser names it
                break
            if math.isinf(number) and "inf" not in token:  # an int too large: no float
                break
            plain[key] = number
        else:
            return plain
    return dict(_parse_literal_dict(text))


def _parse_literal_dict(text: str) -> list[tuple[str, float]]:
    signs = _SIGN_RUN.search(text)
    if signs is not None:
        raise ValueError(f"a run of {len(signs.group())} sign characters is no number's repr")
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"not a complete dict literal ({error.msg}; truncated line?)") from None
    except (RecursionError, MemoryError):
        raise ValueError("nested too deeply to be a metric dict") from None
    if not isinstance(node, ast.Dict):
        raise ValueError("not a dict literal")
    items: list[tuple[str, float]] = []
    for key_node, value_node in zip(node.keys, node.values, strict=True):
        if not (isinstance(key_node, ast.Constant) and isinstance(key_node.value, str)):
            raise ValueError("a dict key is not a string literal")
        try:
            number = _number(value_node)
        except RecursionError:
            raise ValueError("a value nested too deeply to be a metric") from None
        if number is not None:
            items.append((key_node.value, number))
    return items


def _number(node: ast.expr | None) -> float | None:
    """The float a value node spells; None for other literals (skipped); else ValueError."""
    if node is None:
        raise ValueError("dict unpacking in a value")
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, (str, bytes)) or value is None:
            return None
        if not isinstance(value, (bool, int, float)):
            raise ValueError(f"unsupported literal {value!r}")
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"integer {value} does not fit a float") from None
    if isinstance(node, ast.Name) and node.id in _NON_FINITE_NAMES:
        return _NON_FINITE_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _number(node.operand)
        if operand is None or isinstance(node.op, ast.UAdd):
            return operand
        return -operand
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in ("np", "numpy")
        and node.func.attr in _NUMPY_SCALARS
        and len(node.args) == 1
        and not node.keywords
    ):
        number = _number(node.args[0])
        if number is None:
            return None
        # numpy prints a float32/float16 with the fewest digits that identify it in that width
        layout = _NUMPY_NARROW_FLOATS.get(node.func.attr)
        return struct.unpack(layout, struct.pack(layout, number))[0] if layout else number
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        children = [*node.keys, *node.values] if isinstance(node, ast.Dict) else node.elts
        for child in children:
            _number(child)  # a container is skipped only if it holds literals alone
        return None
    raise ValueError(f"value {ast.unparse(node)[:80]!r} is not a literal")
