"""How a preflight reads: the verdict and its root cause first, facts that could not be
checked said so, a table that fits a terminal.

Pure (facts in, text out); the probes and ``env.json`` are ``miles_amd.run.preflight``'s,
and ``env.json`` keeps every fact as probed (this module changes what is shown, not what is
recorded).

- :data:`NEEDS`: which facts a fact's probe depends on. When one of them is not ``ok``, the
  fact is shown ``not checked`` with ``needs X`` (an attention-window reading of a checkpoint
  never downloaded, an all-reduce route when aiter does not import, say nothing about the
  fact itself). The all-reduce route needs aiter except for the rccl control arm, whose route
  is SGLang's own.
- A fact probed ``ok`` whose value starts with ``unknown`` is shown ``unknown``, never ``ok``.
- :func:`verdict_line`: ``preflight: PASS|FAIL - <root cause>``; no AMD GPU and no ROCm is
  "this is not an AMD GPU node", else the facts that failed on their own (not those that
  only need a failed one).
- :func:`table`: fact, shown status, value or what to do, each row cut to :data:`WIDTH`
  columns (``--verbose``: every value and message in full, uncut); a node's words shown by
  ``miles_amd.escape.terminal``.

Tested in ``tests/unit/test_preflight.py`` on this CPU machine, a real "not a node".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from miles_amd.escape import terminal
from miles_amd.records.env import Fact

WIDTH = 100
NOT_A_NODE = "this is not an AMD GPU node"

# fact -> the facts its probe needs (see the module doc)
NEEDS: Mapping[str, tuple[str, ...]] = {
    "gpu_model": ("gpus",),
    "sglang_lora_endpoint": ("sglang",),
    "aiter_commit": ("aiter",),
    "sglang_allreduce": ("sglang", "aiter"),
    "miles_argv": ("miles",),
    "lora_experts": ("miles", "megatron_bridge", "checkpoint"),
    "router_dtype": ("miles", "megatron_bridge", "checkpoint"),
    "attention_window": ("miles", "megatron_bridge", "checkpoint"),
}


@dataclass(frozen=True)
class Shown:
    """One fact as the table shows it."""

    fact: Fact
    status: str  # ok, missing, wrong, unknown, not checked
    needs: tuple[str, ...] = ()  # the failed facts it needs (status "not checked")

    @property
    def text(self) -> str:
        """The value, or what to do: the message of a failed fact, the need of an unchecked."""
        if self.needs:
            return f"needs {', '.join(self.needs)}"
        if self.status in ("missing", "wrong") and self.fact.message:
            value = f"{self.fact.value}: " if self.fact.value else ""
            return value + self.fact.message
        return self.fact.value or "-"


def _needs(fact: Fact, variant: str | None) -> tuple[str, ...]:
    needs = NEEDS.get(fact.name, ())
    if fact.name == "sglang_allreduce" and variant == "rccl":
        needs = tuple(n for n in needs if n != "aiter")
    return needs


def shown(facts: Sequence[Fact]) -> list[Shown]:
    """Every fact as shown (module doc), in probe order."""
    status = {f.name: f.status for f in facts}
    variant = next((f.value for f in facts if f.name == "aiter_variant"), None)
    rows = []
    for fact in facts:
        failed = tuple(n for n in _needs(fact, variant) if status.get(n, "ok") != "ok")
        if failed:
            rows.append(Shown(fact, "not checked", failed))
        elif fact.status == "ok" and fact.value.startswith("unknown"):
            rows.append(Shown(fact, "unknown"))
        else:
            rows.append(Shown(fact, fact.status))
    return rows


def root_failures(rows: Sequence[Shown]) -> list[Shown]:
    """The facts that failed on their own (not only for want of another)."""
    return [r for r in rows if r.status in ("missing", "wrong")]


def verdict_line(rows: Sequence[Shown]) -> str:
    """``preflight: PASS|FAIL - <root cause>`` (module doc)."""
    roots = root_failures(rows)
    unchecked = [r for r in rows if r.status in ("not checked", "unknown")]
    if not roots and not unchecked:
        return f"preflight: PASS - all {len(rows)} facts ok"
    by_name = {r.fact.name: r for r in roots}
    if "gpus" in by_name and "rocm" in by_name:
        cause, others = f"{NOT_A_NODE} (no AMD GPU, no ROCm)", len(roots) - 2
    elif roots:
        cause, others = f"{roots[0].fact.name} {roots[0].status}", len(roots) - 1
    else:
        cause, others = f"{unchecked[0].fact.name} could not be checked", 0
    tail = [f"{others} more failed"] if others else []
    if unchecked:
        tail.append(f"{len(unchecked)} not checked")
    return f"preflight: FAIL - {cause}" + (f"; {', '.join(tail)}" if tail else "")


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def table(rows: Sequence[Shown], *, verbose: bool = False) -> str:
    """The facts as a table (module doc); ``verbose``: value and message columns, uncut."""
    raw: list[tuple[str, ...]] = []
    if verbose:
        raw.append(("fact", "status", "value", "message"))
        raw += [(r.fact.name, r.status, r.fact.value or "-", r.fact.message or "-") for r in rows]
    else:
        raw.append(("fact", "status", "value, or what to do"))
        raw += [(r.fact.name, r.status, r.text) for r in rows]
    cells = [tuple(terminal(cell) for cell in row) for row in raw]  # a node's words
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]).rstrip()
        for row in cells
    ]
    return "\n".join(lines if verbose else [_cut(line, WIDTH) for line in lines])


def as_json(rows: Sequence[Shown]) -> list[dict[str, object]]:
    """Each fact as probed, with what the table shows for it."""
    return [
        {
            "name": r.fact.name,
            "status": r.fact.status,
            "shown": r.status,
            "needs": list(r.needs),
            "value": r.fact.value,
            "message": r.fact.message,
        }
        for r in rows
    ]
