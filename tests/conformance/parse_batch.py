"""Parse many ``train.py`` argvs with miles imported once: one forked child per job.

Executed BY FILE PATH with the conformance python (stdlib only; it imports nothing of
``miles_amd`` or of the tests), by ``harness.parse_all``::

    python parse_batch.py SPEC.json

``SPEC.json``: ``{"miles_parse": <path of miles_parse.py>, "stub_gpu_queries": bool,
"workers": n, "fork_timeout_s": s, "jobs": [{"argv": [...], "env": {...}, "result": path,
"stderr": path, "status": path}, ...]}``. The process is started in the *import env*: the
keys every job of the batch has, with the value all of them give it (PYTHONPATH included).
It loads ``miles_parse.py`` by path, applies its GPU stubs if asked and imports
``miles.utils.arguments`` (torch, sglang, Megatron: about 6 of the 13 CPU-s of a fresh
parse). Then, per job, a forked child replaces ``os.environ`` with exactly the job's env
(``putenv`` too, so C code sees it), sends fds 1 and 2 to the job's stderr file and runs
``miles_parse.main`` on the job's argv: the same parse, result file and exit status as
``python miles_parse.py`` in a fresh interpreter. The parent writes each child's status and
keeps ``workers`` children running at once.

What a fork cannot give a job is what a module computed from the environment while it was
imported. Every key of the import env is the same in every job, so only a key the import
env lacks can differ, and Python code can see an absent key only by asking for it by name
(iterating the env never yields it). The import runs with ``os.environ``'s item lookup
traced (``get``, ``in`` and ``[]`` all go through it): a job that sets a key the import asked
for and did not find is not forked: its status gives the reason, and the caller parses it
in a fresh interpreter. Measured on the pinned sources: Ray's worker asks
for ``CUDA_VISIBLE_DEVICES`` at import, so the HIP-devices variant is parsed fresh; miles
reads ``MILES_CI_GATE_RECORD_DIR`` and ``TENSORBOARD_DIR`` inside ``parse_args``, not at
import. Not traced: C code calling ``getenv`` during the import (none of the keys that differ
between jobs is one torch's or sglang's extensions read at load).
``tests/conformance/test_miles_parser.py`` parses the forked job that differs most from the
import env, and a refusal, in a fresh interpreter too and requires the same outcome.

A child still running after ``fork_timeout_s`` (a parse takes 2-3 s) is killed and its job
sent back the same way: a wedged parse then shows as the fresh parse's own time-out, and a
child that a fork left stuck (a lock some native thread held when the parent forked: the
import leaves jemalloc's and polars' background threads) costs time, never a wrong outcome.

Status file per job: ``{"returncode": int | null, "seconds": s, "fresh_because": str |
null}``; a reason means the job was not parsed here. Exit status: 0 every job has a status;
1 the import failed (traceback on stderr; no job ran, the caller parses them one by one);
64 bad usage.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

USAGE = "usage: parse_batch.py SPEC.json"
POLL_S = 0.05


@contextmanager
def absent_keys_asked() -> Iterator[set[str]]:
    """The env keys asked for by name and not found while the block runs."""
    environ_type = type(os.environ)
    lookup = environ_type.__getitem__
    asked: set[str] = set()

    def traced(self: Any, key: str) -> str:
        try:
            return lookup(self, key)
        except KeyError:
            asked.add(key)
            raise

    environ_type.__getitem__ = traced  # type: ignore[method-assign]
    try:
        yield asked
    finally:
        environ_type.__getitem__ = lookup  # type: ignore[method-assign]


def load_miles_parse(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("miles_parse", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_child(miles_parse: Any, job: dict[str, Any], stub: bool) -> int:
    """In the forked child: the job's env, its output files, miles_parse's own main."""
    os.environ.clear()
    os.environ.update(job["env"])
    out = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    tokens = ["--result", job["result"], *(["--stub-gpu-queries"] if stub else [])]
    try:
        code = int(miles_parse.main([*tokens, "--", *job["argv"]]))
    except SystemExit as exc:  # argparse leaves through SystemExit(2), as in a fresh parse
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def write_status(
    job: dict[str, Any], returncode: int | None, seconds: float, fresh_because: str | None = None
) -> None:
    status = {"returncode": returncode, "seconds": seconds, "fresh_because": fresh_because}
    with open(job["status"], "w", encoding="utf-8") as out:
        json.dump(status, out)


def run_all(miles_parse: Any, spec: dict[str, Any], asked_at_import: set[str]) -> None:
    pending = []
    for job in spec["jobs"]:
        read = sorted(asked_at_import & set(job["env"]))
        if read:
            write_status(job, None, 0.0, f"the import asked for {', '.join(read)}")
        else:
            pending.append(job)
    running: dict[int, tuple[dict[str, Any], float]] = {}
    while pending or running:
        while pending and len(running) < max(1, int(spec["workers"])):
            job = pending.pop(0)
            started = time.monotonic()
            pid = os.fork()
            if pid == 0:
                os._exit(run_child(miles_parse, job, bool(spec["stub_gpu_queries"])))
            running[pid] = (job, started)
        time.sleep(POLL_S)
        for pid, (job, started) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            seconds = time.monotonic() - started
            if done:
                write_status(job, os.waitstatus_to_exitcode(status), seconds)
            elif seconds > float(spec["fork_timeout_s"]):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                limit = float(spec["fork_timeout_s"])
                write_status(job, None, seconds, f"no exit within {limit:g} s of the fork")
            else:
                continue
            del running[pid]


def main(tokens: list[str]) -> int:
    if len(tokens) != 1:
        print(USAGE, file=sys.stderr)
        return 64
    with open(tokens[0], encoding="utf-8") as handle:
        spec = json.load(handle)
    try:
        with absent_keys_asked() as asked:
            miles_parse = load_miles_parse(spec["miles_parse"])
            if spec["stub_gpu_queries"]:
                miles_parse.stub_gpu_queries()
            import miles.utils.arguments  # noqa: F401  (the import every child shares)
    except Exception:
        traceback.print_exc()
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    run_all(miles_parse, spec, asked)
    return 0


if __name__ == "__main__":
    # As miles_parse.py: this file's folder is sys.path[0]; drop it, so the tier's modules
    # next to it can never shadow a top-level module miles imports.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
