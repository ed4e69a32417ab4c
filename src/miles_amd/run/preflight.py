"""Preflight: are this node, image and inputs fit to run the recipe (every fact ``ok``)?

Which probes (:data:`PROBES`), what ``env.json`` holds, how the facts read. ``docs/node.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from miles_amd.escape import terminal
from miles_amd.files import atomic_write_text
from miles_amd.records.env import Fact, FactStatus
from miles_amd.redact import redact
from miles_amd.run import probes as pr
from miles_amd.run import probes_allreduce as ar
from miles_amd.run import probes_miles as pm
from miles_amd.run.probes import IMAGE, PreflightConfig, one_line
from miles_amd.run_dir import RunDir
from miles_amd.variants import AITER_VARIANTS
from miles_amd.wrap import WIDTH, wrapped

__all__ = ["IMAGE", "Fact", "FactStatus", "PreflightConfig", "run_preflight", "write_env_json"]

_RESERVED_ENV_KEYS = frozenset({"facts", "ok", "aiter_variant", "written_at"})

Probe = Callable[[PreflightConfig], Fact]

PROBES: tuple[Probe, ...] = (
    pr.probe_gpus,
    pr.probe_gpu_model,
    pr.probe_rocm,
    pr.probe_torch,
    pr.probe_sglang,
    pr.probe_sglang_lora_endpoint,
    pr.probe_megatron_bridge,
    pr.probe_megatron_lm,
    pr.probe_miles,
    pr.probe_aiter,
    pr.probe_aiter_variant,
    ar.probe_aiter_commit,
    ar.probe_aiter_fix,
    ar.probe_sglang_aiter_env,
    ar.probe_sglang_allreduce,
    pr.probe_checkpoint,
    pr.probe_dataset,
    pm.probe_miles_argv,
    pm.probe_lora_experts,
    pm.probe_router_dtype,
    pm.probe_attention_window,
    pr.probe_disk,
)


def run_preflight(config: PreflightConfig) -> list[Fact]:
    """Every probe's fact in order, redacted; a crashing probe's is ``wrong``."""
    facts = []
    for probe in PROBES:
        try:
            fact = probe(config)
            facts.append(replace(fact, value=redact(fact.value), message=redact(fact.message)))
        except Exception as exc:
            why = redact(f"the probe raised {type(exc).__name__}: {one_line(exc)}")
            facts.append(Fact(probe.__name__.removeprefix("probe_"), "wrong", "", why))
    return facts


def preflight_ok(facts: Iterable[Fact]) -> bool:
    facts = list(facts)
    return bool(facts) and all(f.status == "ok" for f in facts)


def failing_facts(facts: Iterable[Fact]) -> list[Fact]:
    return [f for f in facts if f.status != "ok"]


def write_env_json(facts: Sequence[Fact], run_dir: Path, extra: dict[str, object]) -> Path:
    """``env.json``, atomically: ``facts``, ``ok``, ``aiter_variant`` (or null), ``written_at``
    (UTC, ISO 8601) and ``extra``'s keys."""
    clash = sorted(_RESERVED_ENV_KEYS & extra.keys())
    if clash:
        raise ValueError(f"env.json extra keys {clash} would overwrite the preflight's own")
    variants = [f.value for f in facts if f.name == "aiter_variant" and f.status == "ok"]
    payload: dict[str, object] = {
        "facts": [asdict(f) for f in facts],
        "ok": preflight_ok(facts),
        "aiter_variant": next((v for v in variants if v in AITER_VARIANTS), None),
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
    target = RunDir(run_dir).env_json
    atomic_write_text(target, json.dumps(payload, indent=2, allow_nan=False) + "\n")
    return target


NOT_A_NODE = "this is not an AMD GPU node"

# fact -> the facts its probe needs
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
    fact: Fact
    status: str  # ok, missing, wrong, unknown, not checked
    needs: tuple[str, ...] = ()  # the failed facts it needs (status "not checked")

    @property
    def text(self) -> str:
        if self.needs:
            return f"needs {', '.join(self.needs)}"
        if self.status in ("missing", "wrong") and self.fact.message:
            value = f"{self.fact.value}: " if self.fact.value else ""
            return value + self.fact.message
        return self.fact.value or "-"


def shown(facts: Sequence[Fact]) -> list[Shown]:
    status = {f.name: f.status for f in facts}
    variant = next((f.value for f in facts if f.name == "aiter_variant"), None)
    rows = []
    for fact in facts:
        needs = NEEDS.get(fact.name, ())
        if fact.name == "sglang_allreduce" and variant == "rccl":
            needs = ("sglang",)  # the rccl arm's route does not need aiter
        failed = tuple(n for n in needs if status.get(n, "ok") != "ok")
        if failed:
            rows.append(Shown(fact, "not checked", failed))
        elif fact.status == "ok" and fact.value.startswith("unknown"):
            rows.append(Shown(fact, "unknown"))
        else:
            rows.append(Shown(fact, fact.status))
    return rows


def root_failures(rows: Sequence[Shown]) -> list[Shown]:
    return [r for r in rows if r.status in ("missing", "wrong")]


def verdict_line(rows: Sequence[Shown]) -> str:
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


def table(rows: Sequence[Shown], *, verbose: bool = False) -> str:
    """``verbose``: value and message columns, uncut."""
    raw: list[tuple[str, ...]] = []
    if verbose:
        raw.append(("fact", "status", "value", "message"))
        raw += [(r.fact.name, r.status, r.fact.value or "-", r.fact.message or "-") for r in rows]
    else:
        raw.append(("fact", "status", "value, or what to do"))
        raw += [(r.fact.name, r.status, r.text) for r in rows]
    cells = [tuple(terminal(cell) for cell in row) for row in raw]  # a node's words
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    lines = []
    for row in cells:
        head = "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  "
        # the last cell wrapped in its own column (verbose: in full, on one line)
        parts = [row[-1]] if verbose else wrapped(row[-1], "", max(WIDTH - len(head), 40))
        lines += [(head if i == 0 else " " * len(head)) + part for i, part in enumerate(parts)]
    return "\n".join(line.rstrip() for line in lines)


def as_json(rows: Sequence[Shown]) -> list[dict[str, object]]:
    return [{**asdict(r.fact), "shown": r.status, "needs": list(r.needs)} for r in rows]
