"""The A/B premise: did SGLang's rollout all-reduce run where the run's variant says?

Decides the gate's built-in ``allreduce.path`` check. ROCm/aiter#5694 fixes aiter's custom
all-reduce, so a stock or patched run needs SGLang's all-reduce to have gone through aiter's,
and the rccl control arm needs it not to. Evidence: SGLang's job-log lines (counted by
``evidence.sentinels``) and env.json's ``sglang_allreduce`` prediction.

Outcome, for the run's variant (env.json's, else plan.json's; none recorded needs aiter's;
``tests/unit/test_ab_premise.py``):

- a route other than the needed one in the log (on any engine) or in the prediction: ``fail``,
  naming the line or the fact and the fix;
- the needed route and nothing else: ``pass``;
- no ``[AR]`` line: ``not measured``, and a failure with ``require_env``.

Pure; reads nothing. The log lines and each case: ``docs/node.md`` ("The allreduce.path
check").
"""

from __future__ import annotations

from miles_amd import variants
from miles_amd.evidence.sentinels import ALLREDUCE_AITER, ALLREDUCE_FALLBACK, ALLREDUCE_ONE_STAGE
from miles_amd.evidence.types import EnvRecord, RunEvidence, SentinelHit
from miles_amd.rules.check import BuiltinCheck, Check

_RATIONALE = (
    f"{variants.AITER_FIX} fixes aiter's custom all-reduce: stock vs patched compares it only "
    "if SGLang's rollout all-reduce is aiter's, and the rccl control arm only if it is not"
)
_check = BuiltinCheck("allreduce.path", "allreduce", _RATIONALE)
_FIX = (
    "fix: run with the job env `miles-amd train --aiter-variant VARIANT` sets "
    "(SGLANG_USE_AITER_AR), no SGLANG_USE_1STAGE_ALLREDUCE or deterministic flags, and an aiter "
    "whose custom_all_reduce imports in the job (see the preflight's sglang_allreduce fact)"
)


def allreduce_check(evidence: RunEvidence, variant: str | None, *, require_env: bool) -> Check:
    """``allreduce.path`` of ``evidence`` for ``variant``; see the module doc."""
    want = "aiter" if variants.aiter_allreduce_expected(variant) else "sglang"
    expected = f"SGLang's all-reduce: {'aiter' if want == 'aiter' else 'SGLang own'}"
    hits = {hit.name: hit for hit in evidence.sentinels}
    predicted = _predicted(evidence.env)
    if predicted is not None and not predicted.startswith(want + ":"):
        detail = f"the preflight says the job takes {predicted}, not {want}; {_FIX}"
        return _check("fail", predicted, expected, detail, True)
    wrong = [hits[n] for n in _names_against(want) if n in hits]
    if wrong:
        first = min(wrong, key=lambda hit: hit.first_line)
        detail = (
            f"job.log line {first.first_line}: {first.first_text.strip()[:200]} "
            f"({sum(h.count for h in wrong)}x): the {variant or 'baseline'} run needs {want}'s; "
            f"{_FIX}"
        )
        return _check("fail", _observed(hits), expected, detail, True)
    if _names_for(want) & hits.keys():
        where = ", ".join(f"line {h.first_line} x{h.count}" for h in _ordered(hits, want))
        return _check("pass", _observed(hits), expected, f"job.log: {where}", require_env)
    detail = "not measured: job.log has no SGLang [AR] line saying which all-reduce ran" + (
        f"; the preflight predicted {predicted}" if predicted else ""
    )
    return _check("fail" if require_env else "not_measured", None, expected, detail, require_env)


def _names_for(route: str) -> set[str]:
    return {ALLREDUCE_AITER} if route == "aiter" else {ALLREDUCE_FALLBACK, ALLREDUCE_ONE_STAGE}


def _names_against(route: str) -> list[str]:
    other = "sglang" if route == "aiter" else "aiter"
    return sorted(_names_for(other))


def _ordered(hits: dict[str, SentinelHit], route: str) -> list[SentinelHit]:
    return sorted((hits[n] for n in _names_for(route) if n in hits), key=lambda h: h.first_line)


def _observed(hits: dict[str, SentinelHit]) -> str:
    seen = [
        f"{name} x{hits[name].count}"
        for name in sorted(_names_for("aiter") | _names_for("sglang"))
        if name in hits
    ]
    return ", ".join(seen)


def _predicted(env: EnvRecord | None) -> str | None:
    return (env.value("sglang_allreduce") or None) if env is not None else None
