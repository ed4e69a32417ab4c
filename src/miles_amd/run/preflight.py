"""Environment preflight: is this node, image and set of inputs fit to run the recipe?

Decides which probes make up the preflight (:data:`PROBES`, in table order), how they are run
(:func:`run_preflight`: a probe that crashes is a ``wrong`` fact naming the exception, not a
pass: ``tests/unit/test_preflight.py``; each fact's value and message redacted, since a probe
quotes a child's output: ``miles_amd.redact``, ``tests/unit/test_foreign_text.py``), when the
preflight passes (every fact ``ok``), and what ``env.json`` holds (:func:`write_env_json`,
written atomically to ``RunDir(run_dir).env_json``, so a report and ``baseline record`` can
say which environment produced a run).

Does not decide any single fact: the probes are in ``probes_node`` (GPUs, ROCm, torch) and
``probes_stack`` (packages, checkouts, aiter, inputs, disk), ``probes_allreduce`` (the A/B
premise: the job's SGLang aiter env, aiter's commit and fix, SGLang's all-reduce route),
``probes_bridge`` (the trainer's model as miles builds it: LoRA-wrapped experts, router dtype,
attention windows), a fact's shape in ``facts``.
Nothing on the machine is changed: no server is started and no GPU memory is allocated.

Adding a probe: write ``def probe_<name>(config: PreflightConfig) -> Fact`` in its own module
(the fact's ``name`` is ``<name>``; ``config.recipe()`` gives the recipe when the probe needs
its argv), import it here and add it to :data:`PROBES` where its row should appear. Nothing
else changes: the CLI prints every fact, and ``env.json`` records every fact.

Explained for people in ``docs/node.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path

from miles_amd.files import atomic_write_text
from miles_amd.records.env import Fact, FactStatus
from miles_amd.redact import redact
from miles_amd.run.facts import IMAGE, PreflightConfig, one_line
from miles_amd.run.parse_probe import probe_miles_argv
from miles_amd.run.probes_allreduce import (
    probe_aiter_commit,
    probe_aiter_fix,
    probe_sglang_aiter_env,
    probe_sglang_allreduce,
)
from miles_amd.run.probes_bridge import (
    probe_attention_window,
    probe_lora_experts,
    probe_router_dtype,
)
from miles_amd.run.probes_node import probe_gpu_model, probe_gpus, probe_rocm, probe_torch
from miles_amd.run.probes_stack import (
    probe_aiter,
    probe_aiter_variant,
    probe_checkpoint,
    probe_dataset,
    probe_disk,
    probe_megatron_bridge,
    probe_megatron_lm,
    probe_miles,
    probe_sglang,
    probe_sglang_lora_endpoint,
)
from miles_amd.run_dir import RunDir
from miles_amd.variants import AITER_VARIANTS

__all__ = [
    "IMAGE",
    "PROBES",
    "Fact",
    "FactStatus",
    "PreflightConfig",
    "Probe",
    "failing_facts",
    "preflight_ok",
    "probe_name",
    "run_preflight",
    "write_env_json",
]

_RESERVED_ENV_KEYS = frozenset({"facts", "ok", "aiter_variant", "written_at"})

Probe = Callable[[PreflightConfig], Fact]

PROBES: tuple[Probe, ...] = (
    probe_gpus,
    probe_gpu_model,
    probe_rocm,
    probe_torch,
    probe_sglang,
    probe_sglang_lora_endpoint,
    probe_megatron_bridge,
    probe_megatron_lm,
    probe_miles,
    probe_aiter,
    probe_aiter_variant,
    probe_aiter_commit,
    probe_aiter_fix,
    probe_sglang_aiter_env,
    probe_sglang_allreduce,
    probe_checkpoint,
    probe_dataset,
    probe_miles_argv,
    probe_lora_experts,
    probe_router_dtype,
    probe_attention_window,
    probe_disk,
)


def probe_name(probe: Probe) -> str:
    """The fact name a probe reports: its function name without ``probe_``."""
    return probe.__name__.removeprefix("probe_")


def run_preflight(config: PreflightConfig) -> list[Fact]:
    """Every probe's fact, in :data:`PROBES` order, redacted; a crashing probe is a ``wrong``
    fact."""
    facts = []
    for probe in PROBES:
        try:
            fact = probe(config)
            facts.append(replace(fact, value=redact(fact.value), message=redact(fact.message)))
        except Exception as exc:
            facts.append(
                Fact(
                    probe_name(probe),
                    "wrong",
                    "",
                    redact(f"the probe raised {type(exc).__name__}: {one_line(exc)}"),
                )
            )
    return facts


def preflight_ok(facts: Iterable[Fact]) -> bool:
    """True only for a non-empty list whose facts are all ``ok``."""
    facts = list(facts)
    return bool(facts) and all(f.status == "ok" for f in facts)


def failing_facts(facts: Iterable[Fact]) -> list[Fact]:
    return [f for f in facts if f.status != "ok"]


def write_env_json(facts: Sequence[Fact], run_dir: Path, extra: dict[str, object]) -> Path:
    """Write ``RunDir(run_dir).env_json`` atomically; ``extra`` keys are added at the top level.

    The object holds ``facts`` (each ``name``, ``status``, ``value``, ``message``), ``ok``,
    ``aiter_variant`` (one of ``miles_amd.variants.AITER_VARIANTS`` or null) and ``written_at``
    (UTC, ISO 8601); ``extra`` may not reuse those keys. Returns the path written.
    """
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
