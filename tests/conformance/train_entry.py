"""Run miles' own ``train.py`` as its ``__main__``, with the two GPU queries of
``validate_args`` stubbed: the start-up smoke's job entrypoint on CPU.

Executed BY FILE PATH with the conformance python (it imports nothing of ``miles_amd`` or of
the tests)::

    python train_entry.py <path of miles_parse.py> <miles>/train.py <the tokens after train.py>

The job ``miles-amd train`` submits is ``python3 <miles>/train.py <argv>``; the smoke runs
``python3 train_entry.py <miles_parse.py> <miles>/train.py <argv>``, the same script and
tokens. The one difference: before ``train.py`` runs, ``stub_gpu_queries`` of
``miles_amd/node/miles_parse.py`` (loaded by path, the parse probe's own stubs) makes
``torch.cuda.get_device_capability`` / ``get_device_properties`` report gfx950 when torch
sees no GPU, because Megatron's ``validate_args`` asks for them inside ``parse_args()``
(``--moe-grouped-gemm``, TP > 1) and a CPU torch raises there. Nothing else is changed: the
stubs live in this driver process only; Ray's workers (rollout manager, SGLang engines) get
the real CPU torch, so SGLang's engine finds no accelerator, the stop the smoke expects.
"""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys


def main(tokens: list[str]) -> None:
    if len(tokens) < 2 or not tokens[1].endswith("train.py"):
        sys.exit("usage: train_entry.py <miles_parse.py> <miles>/train.py <train.py args>")
    stubs_file, train_script, train_argv = tokens[0], tokens[1], tokens[2:]
    spec = importlib.util.spec_from_file_location("miles_parse_stubs", stubs_file)
    if spec is None or spec.loader is None:
        sys.exit(f"train_entry.py: cannot load {stubs_file}")
    stubs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stubs)
    stubs.stub_gpu_queries()
    sys.argv = [train_script, *train_argv]
    sys.path[0] = os.path.dirname(os.path.abspath(train_script))  # as `python train.py` has it
    runpy.run_path(train_script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
