"""The A/B premise: did the rollouts' all-reduce run where the variant says, on the aiter it names?

Decides ``allreduce.path`` (SGLang's job-log ``[AR]`` lines and env.json's ``sglang_allreduce``
prediction: stock and patched need aiter's route, the rccl control arm SGLang's own) and
``allreduce.fix`` (the preflight's, canary's and job's aiter fingerprints: against the variant,
differing sources, or a repeated or unreadable job line fail; patched on ``unknown`` is no
evidence). Without evidence: ``not_measured``, a failure with ``require_env``. ``docs/node.md``.
"""

from __future__ import annotations

import json
import re

from miles_amd import aiter_fix, variants
from miles_amd.evidence.sentinels import (
    AITER_FIX_JOB,
    ALLREDUCE_AITER,
    ALLREDUCE_FALLBACK,
    ALLREDUCE_ONE_STAGE,
)
from miles_amd.evidence.types import RunEvidence
from miles_amd.rules.check import BuiltinCheck, Check

_PATH_RATIONALE = (
    f"{variants.AITER_FIX} fixes aiter's custom all-reduce: stock vs patched compares it only "
    "if SGLang's rollout all-reduce is aiter's, and the rccl control arm only if it is not"
)
_path_check = BuiltinCheck("allreduce.path", "allreduce", _PATH_RATIONALE)
_FIX_RATIONALE = (
    f"the A/B compares aiter without and with {variants.AITER_FIX}: a label is not evidence, "
    "the source each process imports is"
)
_fix_check = BuiltinCheck("allreduce.fix", "allreduce", _FIX_RATIONALE)
_VALUE = re.compile(r'"value":\s*("(?:[^"\\]|\\.)*")')
PROCESSES = ("preflight", "canary", "job")
_FIX = (
    "fix: run with the job env `miles-amd train --aiter-variant VARIANT` sets "
    "(SGLANG_USE_AITER_AR), no SGLANG_USE_1STAGE_ALLREDUCE or deterministic flags, and an aiter "
    "whose custom_all_reduce imports in the job (see the preflight's sglang_allreduce fact)"
)


def _names_for(route: str) -> set[str]:
    return {ALLREDUCE_AITER} if route == "aiter" else {ALLREDUCE_FALLBACK, ALLREDUCE_ONE_STAGE}


def allreduce_check(evidence: RunEvidence, variant: str | None, *, require_env: bool) -> Check:
    """``allreduce.path`` of ``evidence`` for ``variant``; see the module doc."""
    want = "aiter" if variants.aiter_allreduce_expected(variant) else "sglang"
    expected = f"SGLang's all-reduce: {'aiter' if want == 'aiter' else 'SGLang own'}"
    hits = {hit.name: hit for hit in evidence.sentinels}
    known = sorted(_names_for("aiter") | _names_for("sglang"))
    observed = ", ".join(f"{name} x{hits[name].count}" for name in known if name in hits)
    env = evidence.env
    predicted = (env.value("sglang_allreduce") or None) if env is not None else None
    if predicted is not None and not predicted.startswith(want + ":"):
        detail = f"the preflight says the job takes {predicted}, not {want}; {_FIX}"
        return _path_check("fail", predicted, expected, detail, True)
    other = "sglang" if want == "aiter" else "aiter"
    wrong = [hits[n] for n in sorted(_names_for(other)) if n in hits]
    if wrong:
        first = min(wrong, key=lambda hit: hit.first_line)
        detail = (
            f"job.log line {first.first_line}: {first.first_text.strip()[:200]} "
            f"({sum(h.count for h in wrong)}x): the {variant or 'baseline'} run needs {want}'s; "
            f"{_FIX}"
        )
        return _path_check("fail", observed, expected, detail, True)
    right = sorted((hits[n] for n in _names_for(want) if n in hits), key=lambda h: h.first_line)
    if right:
        where = ", ".join(f"line {h.first_line} x{h.count}" for h in right)
        return _path_check("pass", observed, expected, f"job.log: {where}", require_env)
    detail = "not measured: job.log has no SGLang [AR] line saying which all-reduce ran" + (
        f"; the preflight predicted {predicted}" if predicted else ""
    )
    return _path_check.absent(None, expected, detail, require_env)


def fix_check(evidence: RunEvidence, variant: str | None, *, require_env: bool) -> Check:
    """``allreduce.fix`` of ``evidence`` for ``variant`` (module doc)."""
    want = {"patched": aiter_fix.FIXED, "stock": aiter_fix.NOT_FIXED}.get(variant or "")
    expected = f"{want or 'any fingerprint'}, one aiter source in {', '.join(PROCESSES)}"
    # each process's fingerprint value, and what is wrong with the job's line
    values: dict[str, str] = {}
    wrong: list[str] = []
    if evidence.env is not None and evidence.env.value("aiter_fix"):
        values["preflight"] = evidence.env.value("aiter_fix")
    if evidence.canary is not None and evidence.canary.aiter_fix:
        values["canary"] = evidence.canary.aiter_fix
    hit = next((h for h in evidence.sentinels if h.name == AITER_FIX_JOB), None)
    if hit is not None:
        found = _VALUE.search(hit.first_text)
        value = json.loads(found.group(1)) if found else None
        if hit.count != 1:
            wrong.append(f"job.log has {hit.count} MILES_AMD_AITER_FIX lines, one expected")
        if isinstance(value, str) and aiter_fix.verdict_of(value) == value.split(":")[0]:
            values["job"] = value
        else:
            wrong.append(f"job.log line {hit.first_line} holds no fingerprint value")
    unknown = []
    for who, value in values.items():
        verdict = aiter_fix.verdict_of(value)
        if want is not None and verdict not in (want, aiter_fix.UNKNOWN):
            wrong.append(f"{who}: {variant} run on {value}")
        elif want == aiter_fix.FIXED and verdict == aiter_fix.UNKNOWN:
            unknown.append(f"{who}: {value} (unknown is no evidence for patched)")
    sources = {who: aiter_fix.source_of(value) or value for who, value in values.items()}
    if len(set(sources.values())) > 1:
        seen = "; ".join(f"{who} {source}" for who, source in sources.items())
        wrong.append(f"the processes saw different aiter sources: {seen}")
    missing = [who for who in PROCESSES if who not in values]
    observed = "; ".join(f"{who}: {value}" for who, value in values.items()) or None
    if wrong:
        return _fix_check("fail", observed, expected, "; ".join(wrong), True)
    if unknown or (missing and require_env) or not values:
        absent = f"not recorded by {', '.join(missing)}" if missing else ""
        detail = "; ".join(part for part in (*unknown, absent) if part)
        if require_env:
            return _fix_check("fail", observed, expected, f"no evidence: {detail}", True)
        return _fix_check("not_measured", observed, expected, f"not measured: {detail}", False)
    detail = f"{', '.join(values)} read {next(iter(sources.values()))}" + (
        f"; not recorded by {', '.join(missing)}" if missing else ""
    )
    return _fix_check("pass", observed, expected, detail, require_env)
