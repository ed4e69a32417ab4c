"""Metric series from the metric lines of a Ray job log (``job.log``), parsed safely.

- Which lines are metric lines and what they say: a line with
  ``] <file>:<lineno> - step|rollout|perf <n>: {`` (miles' log format behind Ray's actor
  prefix); the dict is a Python repr and ``n`` the step of every metric in it; every other
  line is ignored.
- A metric line whose dict cannot be read is a :class:`MetricsFormatError` naming file and
  line, not a skipped line.
- Values: numbers (bools as 1.0/0.0), ``nan``/``inf``, signs, numpy scalar reprs
  (``np.float64(0.5)``); strings, ``None`` and containers are skipped; anything else (a call,
  an attribute, an operator) is an error. Nothing is evaluated.
- The same metric at the same step twice is one point if equal (NaN equals NaN), else an
  error naming both lines.
- Ray's ANSI colour and `` [repeated 2x across cluster]`` suffix are removed.

Caveats:

- Plain-number dicts are read by a regex and ``float``, others by ``ast``; ``ast`` alone put
  the gate over its 1 s target (``benchmarks/bench_gate.py``, figures in the doc).
- Lines come from ``log_lines``; does not decide which source wins (``merge``) or whether the
  values are good (``gate``).

Explained in ``docs/cli.md`` ("How the gate reads a run dir", the job log's metric lines).
"""

from __future__ import annotations

import ast
import math
import re
import struct
from collections import defaultdict

from miles_amd.evidence.errors import MetricsFormatError
from miles_amd.evidence.series import Columns, columns_to_series, new_columns
from miles_amd.evidence.types import SeriesMap

METRIC_MESSAGES = ("step", "rollout", "perf")

_METRIC_LINE = re.compile(
    rf"\] [\w.-]+:\d+ - (?:{'|'.join(METRIC_MESSAGES)}) (-?\d+): (\{{.*)$", re.MULTILINE
)
_RAY_REPEAT = re.compile(r" \[repeated \d+x across cluster\]")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_NUMBER = r"-?(?:[0-9][0-9.e+-]*|inf|nan)"
# More unary signs in a row than any repr prints (one): refused before ``ast`` (issue 26: a
# line of 200,000 minus signs was a MemoryError in the parser).
_SIGN_RUN = re.compile(r"(?:[-+~]\s*){16,}")
_PLAIN_ITEM = rf"'[^'\\\n]*': {_NUMBER}"
_PLAIN_DICT = re.compile(rf"\{{(?:{_PLAIN_ITEM}(?:, {_PLAIN_ITEM})*)?\}}")
_PLAIN_ITEMS = re.compile(rf"'([^'\\\n]*)': ({_NUMBER})")

_NUMPY_MODULES = frozenset({"np", "numpy"})
_NUMPY_SCALARS = frozenset(
    {"float16", "float32", "float64", "longdouble", "int8", "int16", "int32", "int64"}
    | {"uint8", "uint16", "uint32", "uint64", "bool_", "bool"}
)
_NUMPY_NARROW_FLOATS = {"float32": "<f", "float16": "<e"}
_NON_FINITE_NAMES = {"nan": math.nan, "inf": math.inf}


class _NotAScalar(Exception):
    """A literal that is not a number (string, None, container): skipped, not an error."""


class MetricLines:
    """The metric lines of one log, fed in order as blocks of whole lines (``log_lines``).

    Memory grows with the metric points found, not with the log: other lines are only
    searched, not kept. A repeated line costs O(keys): it is checked against each key's first
    value at its step (``tests/unit/test_evidence_job_log.py``: 20,000 repeats).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._points: defaultdict[str, Columns] = defaultdict(new_columns)
        # per step, each key's first value and its line: a repeat is checked in O(keys)
        self._first_at_step: dict[int, dict[str, tuple[float, int]]] = {}

    def feed(self, first_line: int, text: str) -> None:
        """Read the metric lines of ``text``, whose first line is line ``first_line``."""
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        path = self.path
        line_number, counted_to = first_line, 0
        for match in _METRIC_LINE.finditer(text):
            line_number += text.count("\n", counted_to, match.start())
            counted_to = match.start()
            try:
                step = int(match.group(1))
                values = parse_metric_dict(match.group(2))
            except ValueError as error:
                reason = f"unreadable metric line: {error}"
                raise MetricsFormatError(path, line_number, reason) from None
            first = self._first_at_step.setdefault(step, {})
            values = _drop_repeats(values, first, step, path, line_number)
            for key, value in values.items():
                columns = self._points[key]
                columns[0].append(step)
                columns[1].append(value)

    def series(self) -> SeriesMap:
        return columns_to_series(self._points)


def _drop_repeats(
    values: dict[str, float],
    first: dict[str, tuple[float, int]],
    step: int,
    path: str,
    line_number: int,
) -> dict[str, float]:
    """``values`` without the keys an earlier line of ``step`` already gave the same value;
    records the new ones in ``first``. A different value is a ``MetricsFormatError``."""
    kept = {}
    for key, value in values.items():
        earlier = first.get(key)
        if earlier is None:
            first[key] = (value, line_number)
            kept[key] = value
        elif not _same(earlier[0], value):
            raise MetricsFormatError(
                path,
                line_number,
                f"{key!r} at step {step} is {value!r} here but {earlier[0]!r} at line "
                f"{earlier[1]} (two runs in one log? keep one run per job.log)",
            )
    return kept


def parse_metric_dict(text: str) -> dict[str, float]:
    """The scalars of one metric dict repr (the rest of its line); ``ValueError`` if unreadable.

    Two readers, each taking only what it reads exactly as Python would: a regex for a
    dict of plain numbers (``nan``/``inf`` included), the common case, and the ``ast``
    walker for everything else.
    """
    text = text.rstrip()
    repeat = text.rfind(" [repeated ")
    if repeat > 0 and _RAY_REPEAT.fullmatch(text, repeat):
        text = text[:repeat].rstrip()
    if _PLAIN_DICT.fullmatch(text):
        plain = _plain_numbers(text)
        if plain is not None:
            return plain
    return dict(_parse_literal_dict(text))


def _plain_numbers(text: str) -> dict[str, float] | None:
    """The items of a dict of plain numbers, or None to leave it to the strict parser.

    ``float`` turns an integer too large for a float into inf, where Python's own reading
    of the literal (an ``int``) cannot become a float at all; such tokens, and tokens like
    ``1.2.3``, go to the strict parser, which names the problem.
    """
    values = {}
    for key, token in _PLAIN_ITEMS.findall(text):
        try:
            number = float(token)
        except ValueError:
            return None
        if math.isinf(number) and "inf" not in token:
            return None
        values[key] = number
    return values


def _parse_literal_dict(text: str) -> list[tuple[str, float]]:
    signs = _SIGN_RUN.search(text)
    if signs is not None:  # Python prints one sign at most: a run is a bomb for the parser
        raise ValueError(f"a run of {len(signs.group())} sign characters is no number's repr")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not a complete dict literal ({error.msg}; truncated line?)") from None
    except (RecursionError, MemoryError):
        raise ValueError("nested too deeply to be a metric dict") from None
    node = tree.body
    if not isinstance(node, ast.Dict):
        raise ValueError("not a dict literal")
    items: list[tuple[str, float]] = []
    for key_node, value_node in zip(node.keys, node.values, strict=True):
        if not (isinstance(key_node, ast.Constant) and isinstance(key_node.value, str)):
            raise ValueError("a dict key is not a string literal")
        try:
            items.append((key_node.value, _number(value_node)))
        except _NotAScalar:
            continue
        except RecursionError:
            raise ValueError("a value nested too deeply to be a metric") from None
    return items


def _number(node: ast.expr) -> float:
    """The float a value node spells; ``_NotAScalar`` for other literals, else ValueError."""
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, (bool, int, float)):
            return _to_float(value)
        if isinstance(value, (str, bytes)) or value is None:
            raise _NotAScalar
        raise ValueError(f"unsupported literal {value!r}")
    if isinstance(node, ast.Name) and node.id in _NON_FINITE_NAMES:
        return _NON_FINITE_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _number(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    numpy_call = _numpy_scalar_call(node)
    if numpy_call is not None:
        kind, argument = numpy_call
        number = _number(argument)
        # numpy prints a float32/float16 with the fewest digits that identify it *in that
        # width* (np.float32(41869368.0) prints as 41869370.0), so round back to that width.
        layout = _NUMPY_NARROW_FLOATS.get(kind)
        return struct.unpack(layout, struct.pack(layout, number))[0] if layout else number
    if isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
        _check_literal_container(node)
        raise _NotAScalar
    raise ValueError(f"value {ast.unparse(node)[:80]!r} is not a literal")


def _to_float(value: bool | int | float) -> float:
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"integer {value} does not fit a float") from None


def _numpy_scalar_call(node: ast.expr) -> tuple[str, ast.expr] | None:
    """``(type name, argument)`` of a numpy scalar repr like ``np.float64(0.5)``, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in _NUMPY_MODULES
        and node.func.attr in _NUMPY_SCALARS
        and len(node.args) == 1
        and not node.keywords
    ):
        return node.func.attr, node.args[0]
    return None


def _check_literal_container(node: ast.expr) -> None:
    """A container value is skipped, but only if it holds literals alone."""
    children: list[ast.expr | None] = []
    if isinstance(node, ast.Dict):
        children = [*node.keys, *node.values]
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        children = list(node.elts)
    for child in children:
        if child is None:
            raise ValueError("dict unpacking in a value")
        try:
            _number(child)
        except _NotAScalar:
            continue


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)
