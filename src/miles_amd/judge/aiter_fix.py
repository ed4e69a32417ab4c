"""Did the run import the aiter its variant names? The fix of ROCm/aiter#5694, read from source.

Decides the gate's built-in ``allreduce.fix`` check from the three processes' fingerprints
(``miles_amd.aiter_fix``): env.json's ``aiter_fix`` fact (the preflight, with the job's
python path), canary.json's ``aiter_fix`` (the canary's ranks) and the job's own
``MILES_AMD_AITER_FIX`` line in job.log (sentinel ``aiter_fix_job``, exactly once):

- a fingerprint against the variant (patched and ``not fixed``, stock and ``fixed``), two
  processes that read different aiter sources (header path and digest), or a job line that is
  repeated or unreadable: ``fail``, naming each;
- patched with an ``unknown`` fingerprint: ``unknown`` is no evidence for patched: a failure
  with ``require_env``, else ``not_measured``;
- a process that recorded none: ``not_measured`` if none did, and with ``require_env`` (the
  hardware path) a failure naming it;
- else ``pass``: every process read the same file, and it is what the variant says.

Pure; reads nothing. ``docs/node.md`` ("Which aiter a run imports, and whether it holds the
fix").
"""

from __future__ import annotations

import json
import re

from miles_amd import aiter_fix
from miles_amd.evidence.sentinels import AITER_FIX_JOB
from miles_amd.evidence.types import RunEvidence
from miles_amd.rules.check import BuiltinCheck, Check
from miles_amd.variants import AITER_FIX

_RATIONALE = (
    f"the A/B compares aiter without and with {AITER_FIX}: a label is not evidence, the source "
    "each process imports is"
)
_check = BuiltinCheck("allreduce.fix", "allreduce", _RATIONALE)
_VALUE = re.compile(r'"value":\s*("(?:[^"\\]|\\.)*")')
PROCESSES = ("preflight", "canary", "job")


def recorded(evidence: RunEvidence) -> tuple[dict[str, str], list[str]]:
    """(process -> fingerprint value, what is wrong with the job's line)."""
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
    return values, wrong


def fix_check(evidence: RunEvidence, variant: str | None, *, require_env: bool) -> Check:
    """``allreduce.fix`` of ``evidence`` for ``variant`` (module doc)."""
    want = {"patched": aiter_fix.FIXED, "stock": aiter_fix.NOT_FIXED}.get(variant or "")
    expected = f"{want or 'any fingerprint'}, one aiter source in {', '.join(PROCESSES)}"
    values, wrong = recorded(evidence)
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
        return _check("fail", observed, expected, "; ".join(wrong), True)
    if unknown or (missing and require_env) or not values:
        absent = f"not recorded by {', '.join(missing)}" if missing else ""
        detail = "; ".join(part for part in (*unknown, absent) if part)
        if require_env:
            return _check("fail", observed, expected, f"no evidence: {detail}", True)
        return _check("not_measured", observed, expected, f"not measured: {detail}", False)
    detail = f"{', '.join(values)} read {next(iter(sources.values()))}" + (
        f"; not recorded by {', '.join(missing)}" if missing else ""
    )
    return _check("pass", observed, expected, detail, require_env)
