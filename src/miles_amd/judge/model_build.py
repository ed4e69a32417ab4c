"""The trainer's model as built: do the MoE experts carry the LoRA adapters the run trains?

Decides the built-in ``model.lora_experts`` check from env.json's deep-probe facts: 0 expert
linears LoRA-wrapped, a ``wrong`` fact, or ``attention_window`` ``wrong`` fails;
``router_dtype`` is reported, never failed (miles#3263, tracked). Without env.json or a count
(a CPU machine): ``not_measured``, a failure with ``require_env``. Pure. ``docs/node.md``.
"""

from __future__ import annotations

import re

from miles_amd.evidence.types import EnvRecord, RunEvidence
from miles_amd.rules.check import BuiltinCheck, Check

_RATIONALE = (
    "a LoRA target that maps to no expert layer trains no adapter and the run still looks "
    "healthy; only the built model shows it"
)
_check = BuiltinCheck("model.lora_experts", "model", _RATIONALE)
_COUNT = re.compile(r"^(\d+) expert linears LoRA-wrapped")
EXPECTED = "> 0 MoE expert linears LoRA-wrapped, attention windows as config.json"
_HOW = "run `miles-amd preflight --run-dir RUN` on the node (the image's Megatron-Bridge) first"
_ROUTER_ISSUE = "miles#3263"


def _fact(env: EnvRecord, name: str) -> tuple[str, str, str]:
    fact = env.facts.get(name)
    return ("", "", "") if fact is None else (fact.status, fact.value, fact.message)


def model_build_check(evidence: RunEvidence, *, require_env: bool) -> Check:
    """``model.lora_experts`` of ``evidence``; see the module doc."""
    if evidence.env is None:
        detail = f"not measured: no env.json in the run dir; {_HOW}"
        return _check.absent(None, EXPECTED, detail, require_env)
    facts = evidence.env
    status, value, message = _fact(facts, "lora_experts")
    count = _COUNT.match(value)
    if count is None:
        said = value or "no lora_experts fact (a preflight older than the deep probe)"
        detail = f"not measured: env.json's lora_experts: {said}; {_HOW}"
        return _check.absent(None, EXPECTED, detail, require_env)
    observed = int(count.group(1))
    router = _fact(facts, "router_dtype")[1] or "not recorded"
    tracked = " (known, tracked: not a failure)" if _ROUTER_ISSUE in router else ""
    note = f"; router {router}{tracked}"
    if observed == 0 or status != "ok":
        detail = f"{value}: {message or 'no expert adapter'}{note}"
        return _check("fail", observed, EXPECTED, detail, True)
    window_status, window, window_message = _fact(facts, "attention_window")
    if window_status not in ("", "ok"):
        detail = f"attention windows: {window}: {window_message}{note}"
        return _check("fail", observed, EXPECTED, detail, True)
    windows = f"; attention: {window}" if window else ""
    return _check("pass", observed, EXPECTED, f"{value}{windows}{note}", require_env)
