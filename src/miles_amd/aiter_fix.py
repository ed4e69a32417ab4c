"""Does the aiter a Python would import hold ROCm/aiter#5694's fix? Read from its
``custom_all_reduce.cuh`` (whitespace ignored) against the lines the fix changed between
e4048607 and 01f53100. Standard library only: run as ``python3 -c <source>`` in the job's own
Python, it prints one ``MILES_AMD_AITER_FIX <json>`` line. ``docs/node.md`` ("Which aiter a run
imports, and whether it holds the fix").
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys

FIXED, NOT_FIXED, UNKNOWN = "fixed", "not fixed", "unknown"
MARKER = "MILES_AMD_AITER_FIX "
HEADER = os.path.join("csrc", "include", "custom_all_reduce.cuh")
KERNEL = "cross_device_reduce_2stage(RankData*"
# Whitespace-free forms of the lines that decide (module doc).
HAS_TAIL = "boolhas_tail=false>"
WHOLE_TILES = ("loop_end-=(end-start)%tnum_gpu;", "for(;idx<loop_end;idx+=stride)")
TAIL_DISPATCH = "elseif(size%THREAD_NUM!=0){KL(ngpus,name,true);}"
UNBOUNDED = "for(intidx=start+tid;idx<end;idx+=stride)"
MAX_HEADER_BYTES = 16 * 1024 * 1024


def squeeze(text: str) -> str:
    """Without line continuations and whitespace (clang-format cannot move them)."""
    return re.sub(r"\s+", "", text.replace("\\\n", "\n"))


def stage1(squeezed: str) -> tuple[str, str] | None:
    """(the kernel's template head, its text up to stage 1's ``end_sync``)."""
    at = squeezed.find(KERNEL)
    if at < 0:
        return None
    start = squeezed.rfind("template<", 0, at)
    head = squeezed[start:at] if start >= 0 else ""
    end = squeezed.find("end_sync<", at)
    return head, squeezed[at : end if end > 0 else len(squeezed)]


def classify(text: str) -> tuple[str, str]:
    """(verdict, why) of a ``custom_all_reduce.cuh`` text."""
    squeezed = squeeze(text)
    found = stage1(squeezed)
    if found is None:
        return UNKNOWN, "no cross_device_reduce_2stage kernel in the header"
    head, body = found
    marks = {
        "the has_tail template parameter": HAS_TAIL in head,
        "the whole-tile stage-1 loop": all(m in body for m in WHOLE_TILES),
        "the has_tail dispatch": TAIL_DISPATCH in squeezed,
    }
    if all(marks.values()):
        return FIXED, "stage 1 runs whole tiles; the tail has its own instantiation"
    if not any(marks.values()) and UNBOUNDED in body:
        return NOT_FIXED, "stage 1 loops to the partition's end (the racy shape of e4048607)"
    have = [name for name, there in marks.items() if there]
    lack = [name for name, there in marks.items() if not there]
    return UNKNOWN, (
        f"another shape: has {', '.join(have) or 'none of the fix'}; lacks {', '.join(lack)}"
    )


def locate() -> tuple[str | None, str | None, str]:
    """(package dir, header path, why) of the aiter this Python would import."""
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError) as exc:
        return None, None, f"finding module aiter failed: {type(exc).__name__}: {exc}"
    if spec is None or not spec.submodule_search_locations:
        return None, None, "no module aiter on this Python's path"
    package = os.path.realpath(next(iter(spec.submodule_search_locations)))
    parent = os.path.dirname(package)
    meta = os.environ.get("AITER_META_DIR")  # aiter's JIT compiles its csrc when it has one
    for root in (*([meta] if meta else []), os.path.join(parent, "aiter_meta"), parent):
        header = os.path.join(root, HEADER)
        if os.path.isfile(header):
            return package, header, ""
    return package, None, f"no {HEADER} in aiter_meta/ or beside {package}"


def value(verdict: str, why: str, header: str | None = None, data: bytes = b"") -> str:
    if header is None:
        return f"{verdict}: {why}"
    return f"{verdict}: {header} sha256:{hashlib.sha256(data).hexdigest()[:12]} ({why})"


def source_of(recorded: str) -> str | None:
    """The header and digest a recorded value names, if any."""
    match = re.match(r"^(?:fixed|not fixed|unknown): (/\S.*? sha256:[0-9a-f]{12})", recorded)
    return match.group(1) if match else None


def verdict_of(recorded: str) -> str:
    """The verdict a recorded value starts with, else ``unknown``."""
    for verdict in (NOT_FIXED, FIXED, UNKNOWN):
        if recorded.startswith(verdict + ":"):
            return verdict
    return UNKNOWN


def read_header(header: str) -> tuple[bytes | None, str]:
    """(the header's bytes, at most :data:`MAX_HEADER_BYTES`, or None, why)."""
    try:
        with open(header, "rb") as f:
            data = f.read(MAX_HEADER_BYTES + 1)
    except OSError as exc:
        return None, f"cannot read {header}: {exc.strerror or exc}"
    if len(data) > MAX_HEADER_BYTES:
        return None, f"{header} is over {MAX_HEADER_BYTES} bytes: not aiter's header"
    return data, ""


def fingerprint() -> dict[str, str | None]:
    """This Python's aiter, judged: ``value``, ``package_dir`` and ``header``."""
    package, header, why = locate()
    if header is None:
        return {"value": value(UNKNOWN, why), "package_dir": package, "header": None}
    data, why = read_header(header)
    if data is None:
        return {"value": value(UNKNOWN, why), "package_dir": package, "header": header}
    verdict, why = classify(data.decode("utf-8", errors="replace"))
    return {"value": value(verdict, why, header, data), "package_dir": package, "header": header}


def main() -> None:
    # "value" first: a reader that keeps a line's first 500 characters keeps it whole
    sys.stdout.write(MARKER + json.dumps(fingerprint()) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
