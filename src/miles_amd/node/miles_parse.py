"""Run miles' own ``parse_args()`` on a ``train.py`` argv and write what it decided as JSON.

Stdlib-only, run by path with the job's interpreter (:data:`USAGE`). Exit 0 parsed, 2 refused by
argparse, 1 by a validator or import, 64 bad usage. The GPU stubs act on CPU only.
``docs/conformance.md`` ("How the argv is parsed").
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any

# AMD Instinct MI355X / MI350X (gfx950): ROCm torch reports gfx9.5 as capability (9, 5).
GFX950_CAPABILITY = (9, 5)
USAGE = "usage: miles_parse.py --result FILE [--stub-gpu-queries] -- <train.py args>"


def stub_gpu_queries() -> bool:
    """Stub the two device queries when torch sees no GPU; whether it did."""
    import torch

    if torch.cuda.is_available():
        return False
    major, minor = GFX950_CAPABILITY
    props = SimpleNamespace(major=major, minor=minor, name="MI355X (stub)", gcnArchName="gfx950")
    torch.cuda.get_device_capability = lambda device=None: GFX950_CAPABILITY

    def properties(device: object = None) -> Any:
        return props

    torch.cuda.get_device_properties = properties
    return True


def _jsonable(value: Any) -> Any:
    """JSON values as they are; anything else (dtypes, enums, objects, nan) as its repr."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _jsonable(v) for k, v in value.items()}
    return repr(value)


def _write(path: str, payload: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump(payload, out, sort_keys=True)


def main(tokens: list[str]) -> int:
    if "--" not in tokens:
        print(USAGE, file=sys.stderr)
        return 64
    split = tokens.index("--")
    own, train_argv = tokens[:split], tokens[split + 1 :]
    stub = "--stub-gpu-queries" in own
    own = [t for t in own if t != "--stub-gpu-queries"]
    if len(own) != 2 or own[0] != "--result":
        print(USAGE, file=sys.stderr)
        return 64
    result = own[1]
    sys.argv = ["train.py", *train_argv]
    try:
        stubbed = stub_gpu_queries() if stub else False
        from miles.utils.arguments import parse_args  # as train.py

        args = parse_args()  # argparse exits 2 on its own
    except Exception as exc:
        traceback.print_exc()
        error = " ".join(f"{type(exc).__name__}: {exc}".split())
        _write(result, {"ok": False, "error": error})
        return 1
    parsed = {name: _jsonable(value) for name, value in sorted(vars(args).items())}
    _write(result, {"ok": True, "gpu_queries_stubbed": stubbed, "args": parsed})
    return 0


if __name__ == "__main__":
    # Run by path, this file's folder is sys.path[0]: drop it, so no module next to it can
    # shadow a top-level module miles imports.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
