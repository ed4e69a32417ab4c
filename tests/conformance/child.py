"""What the conformance tier runs in another interpreter, by file path (stdlib at load)::

    python child.py batch SPEC.json         # many parses, miles imported once, a fork per job
    python child.py semantics RESULT LORA_NAMES RECIPE_FLAGS -- <train.py args>
    python child.py train <miles>/train.py <train.py args>    # train.py as __main__
    python child.py census CENSUS_SCRIPT RESULT [TARGETS...] -- <train.py args>  # census python
    python child.py history TEST_PATH CANDIDATE_JSON      # cwd: a history export; miles' tests/ci

``batch``, ``semantics`` and ``train`` stub the GPU queries first (``node/miles_parse.py``); a
``batch`` job whose env the import read, or whose fork hangs, is sent back to be parsed fresh.
docs/conformance.md says what each proves.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import importlib.util
import json
import logging
import os
import re
import runpy
import signal
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MILES_PARSE = Path(__file__).resolve().parents[2] / "src" / "miles_amd" / "node" / "miles_parse.py"
LORA_CLASS_NAMES = {"lora": "LoRA", "canonical_lora": "CanonicalLoRA"}  # create_lora_instance
ENGINE_0 = (0, "127.0.0.1:20000", 20001, "127.0.0.1", 20002)  # _compute_server_args' arguments


def load(name: str, path: str | Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_miles_parse() -> Any:
    module = load("miles_parse", MILES_PARSE)
    module.stub_gpu_queries()
    return module


# ---- batch ----------------------------------------------------------------------------------


@contextmanager
def absent_keys_asked() -> Iterator[set[str]]:
    """The env keys asked for and not found in the block."""
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


def run_forked(miles_parse: Any, job: dict[str, Any]) -> int:
    """In the fork: the job's env only, fds 1 and 2 to its stderr file, the parse."""
    os.environ.clear()
    os.environ.update(job["env"])
    out = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    try:
        code = int(
            miles_parse.main(["--result", job["result"], "--stub-gpu-queries", "--", *job["argv"]])
        )
    except SystemExit as exc:  # argparse leaves through SystemExit(2), as in a fresh parse
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def write_status(
    job: dict[str, Any], code: int | None, seconds: float, fresh: str | None = None
) -> None:
    with open(job["status"], "w", encoding="utf-8") as out:
        json.dump({"returncode": code, "seconds": seconds, "fresh_because": fresh}, out)


def batch(spec_file: str) -> int:
    spec = json.loads(Path(spec_file).read_text(encoding="utf-8"))
    try:
        with absent_keys_asked() as asked:
            miles_parse = load_miles_parse()
            import miles.utils.arguments  # noqa: F401  (the import every child shares)
    except Exception:
        traceback.print_exc()
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    pending, limit = [], float(spec["fork_timeout_s"])
    for job in spec["jobs"]:
        read = sorted(asked & set(job["env"]))
        if read:
            write_status(job, None, 0.0, f"the import asked for {', '.join(read)}")
        else:
            pending.append(job)
    running: dict[int, tuple[dict[str, Any], float]] = {}
    while pending or running:
        while pending and len(running) < max(1, int(spec["workers"])):
            job, started = pending.pop(0), time.monotonic()
            pid = os.fork()
            if pid == 0:
                os._exit(run_forked(miles_parse, job))
            running[pid] = (job, started)
        time.sleep(0.05)
        for pid, (job, started) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            seconds = time.monotonic() - started
            if done:
                write_status(job, os.waitstatus_to_exitcode(status), seconds)
            elif seconds > limit:  # a lock a native thread held at the fork: costs time only
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                write_status(job, None, seconds, f"no exit within {limit:g} s of the fork")
            else:
                continue
            del running[pid]
    return 0


# ---- semantics: what miles' own code makes of the parsed argv -----------------------------


def function_paths(args: Any) -> dict[str, str]:
    """Every set ``args.<x>_path`` miles loads as a function, loaded."""
    import miles
    from miles.utils.misc import load_function

    names: set[str] = set()
    for source in Path(miles.__file__).parent.rglob("*.py"):
        lines = source.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if re.search(r"\bload_(?:rollout_)?function\(", line):  # or two lines above it
                window = "\n".join(lines[max(0, i - 2) : i + 1])
                names.update(re.findall(r"args\.(\w+_path)\b", window))
    out = {}
    for name in sorted(n for n in names if getattr(args, n, None) is not None):
        try:
            out[name] = "ok" if callable(load_function(getattr(args, name))) else "not callable"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def semantics(train_argv: list[str], result: str, lora_names: str, recipe_flags: str) -> int:
    """What miles' and SGLang's code make of the parsed argv (docs/conformance.md)."""
    miles_parse = load_miles_parse()
    parsers: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_known_args

    def recording(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        parsers.append(self)
        return original(self, *a, **k)

    argparse.ArgumentParser.parse_known_args = recording  # type: ignore[method-assign]
    sys.argv = ["train.py", *train_argv]
    from miles.backends.megatron_utils.lora_utils import convert_target_modules_to_megatron
    from miles.backends.sglang_utils import sglang_engine
    from miles.ray.rollout.rollout_server import _resolve_sglang_config
    from miles.rollout.rm_hub import async_rm
    from miles.utils.arguments import parse_args
    from miles.utils.types import Sample
    from sglang.srt import server_args

    args = parse_args()
    parser = max(parsers, key=lambda p: len(p._actions))
    dests = {opt: action.dest for opt, action in parser._option_string_actions.items()}
    engines = 0
    for model in _resolve_sglang_config(args).models:
        model.resolve(args)
        for group in model.server_groups:
            engines += group.num_gpus // min(group.num_gpus_per_engine, args.num_gpus_per_node)
    dp, samples = args.data_parallel_size, args.rollout_batch_size * args.n_samples_per_prompt

    def score(response: str) -> Any:
        return asyncio.run(async_rm(args, Sample(prompt="1 + 1 = ?", response=response, label="2")))

    lora_cls = type(LORA_CLASS_NAMES[args.lora_type], (), {})

    def convert(names: list[str]) -> list[str]:
        return list(convert_target_modules_to_megatron(names, lora_type=lora_cls))

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    sglang_engine.logger.addHandler(handler)
    kwargs, _ = sglang_engine._compute_server_args(args, *ENGINE_0)
    sglang_engine.logger.removeHandler(handler)
    sglang_dests = sorted({dests[f] for f in recipe_flags.split(",") if f in dests})
    marked = copy.deepcopy(args)
    probes = {d: f"<probe {i}>" for i, d in enumerate(sglang_dests) if d.startswith("sglang_")}
    for dest, probe in probes.items():
        setattr(marked, dest, probe)
    reached = {
        json.dumps(v, default=repr)
        for v in sglang_engine._compute_server_args(marked, *ENGINE_0)[0].values()
    }
    out = {
        "dests": dests,
        "derived": {
            "world_size": args.world_size,
            "data_parallel_size": dp,
            "rollout_num_gpus": args.rollout_num_gpus,
            "rollout_engines": engines,
            "optimizer_steps_per_rollout": (samples // dp) // (args.global_batch_size // dp),
        },
        "function_paths": function_paths(args),
        "rewards": {
            "right": score("So 1 + 1 = \\boxed{2}."),
            "wrong": score("So 1 + 1 = \\boxed{3}."),
        },
        "lora": {
            "lora_class": lora_cls.__name__,
            "targets": convert(list(args.target_modules)),
            "each": {name: convert([name]) for name in lora_names.split(",") if name},
        },
        "server_args": {
            "kwargs": miles_parse._jsonable(kwargs),
            "dropped": [r for r in records if "not supported" in r],
        },
        "sglang_flag_use": {
            d: "used" if json.dumps(p) in reached else "overridden" for d, p in probes.items()
        },
        "args": miles_parse._jsonable(vars(args)),
    }
    server_args.get_device = lambda device_id=None: "cuda"
    server_args.get_device_memory_capacity = lambda device=None: 288 * 1024  # MiB, one MI355X
    server_args.is_hip = lambda: True
    try:
        server_args.ServerArgs(**kwargs)
        out["server_args"]["accepted"] = "ok"
    except Exception as exc:
        traceback.print_exc()
        out["server_args"]["accepted"] = f"{type(exc).__name__}: {exc}"
    Path(result).write_text(json.dumps(out, sort_keys=True), encoding="utf-8")
    return 0


def train(train_script: str, train_argv: list[str]) -> int:
    """``python3 <miles>/train.py <argv>``, stubbed in this driver process only."""
    load_miles_parse()
    sys.argv = [train_script, *train_argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(train_script)))  # as `python train.py`
    runpy.run_path(train_script, run_name="__main__")
    return 0


# ---- census: node/bridge_census.py on CPU ------------------------------------------------

INT_FLAGS = (  # read by _setup_lora_model_via_bridge / create_lora_instance
    "tensor-model-parallel-size", "pipeline-model-parallel-size", "expert-model-parallel-size",
    "expert-tensor-parallel-size", "context-parallel-size", "recompute-num-layers", "lora-rank",
    "lora-alpha",
)  # fmt: skip
STR_FLAGS = ("hf-checkpoint", "recompute-granularity", "recompute-method", "optimizer")


def bridge_namespace(tokens: list[str]) -> argparse.Namespace:
    from megatron.core.transformer.enums import AttnBackend

    def value(flag: str) -> str | None:
        return tokens[tokens.index(f"--{flag}") + 1] if f"--{flag}" in tokens else None

    fields: dict[str, Any] = {f.replace("-", "_"): value(f) for f in STR_FLAGS}
    fields.update({f.replace("-", "_"): int(v) for f in INT_FLAGS if (v := value(f)) is not None})
    targets = value("target-modules") or ""
    fields.update(
        target_modules=[m.strip() for m in targets.split(",")] if "," in targets else [targets],
        lora_dropout=float(value("lora-dropout") or 0.0),
        lora_type=value("lora-type") or "lora",
        exclude_modules=value("exclude-modules"),
        sequence_parallel="--sequence-parallel" in tokens,
        virtual_pipeline_model_parallel_size=None,
        gradient_accumulation_fusion=False,
        recompute_modules=None,
        distribute_saved_activations=False,
        attention_backend=AttnBackend[value("attention-backend") or "auto"],
        accumulate_allreduce_grads_in_fp32=False,
        offload_train=False,
    )
    return argparse.Namespace(**fields)


class AnyAttribute(types.ModuleType):
    """A module whose every public attribute is a fresh empty ``nn.Module`` subclass."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        import torch

        made = type(name, (torch.nn.Module,), {})
        setattr(self, name, made)
        return made


def install_stand_ins() -> None:
    """Stand-ins for what has no CPU build: transformer_engine, grouped GEMM, TE fusion, two
    device queries; the real packages where present."""
    import megatron.core.transformer.attention as attention  # TE-less, before the fake
    import torch

    cuda: Any = torch.cuda
    if not cuda.is_available():  # the token dispatcher's stream, the YaRN table's device
        cuda.current_device = lambda: torch.device("cpu")
        cuda.Stream = type("NoStream", (), {"__init__": lambda self, *a, **k: None})
    if importlib.util.find_spec("transformer_engine") is None:
        names = (
            "transformer_engine",
            "transformer_engine.pytorch",
            "transformer_engine.pytorch.ops",
        )
        root, pytorch, ops = (AnyAttribute(name) for name in names)
        root.pytorch, pytorch.ops = pytorch, ops  # type: ignore[attr-defined]
        sys.modules.update({m.__name__: m for m in (root, pytorch, ops)})
        import megatron.bridge.peft.utils as peft_utils

        peft_utils.HAVE_TE = False
    if not isinstance(attention.TELinear, type):  # a non-type without TE: isinstance refuses it
        attention.TELinear = type("NoTELinear", (), {})
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge
    from megatron.bridge.models.gpt_provider import local_layer_spec

    original = AutoBridge.to_megatron_provider

    def to_megatron_provider(self: Any, *args: Any, **kwargs: Any) -> Any:
        provider = original(self, *args, **kwargs)
        provider.transformer_layer_spec = local_layer_spec
        provider.moe_grouped_gemm = False  # the local grouped MLP needs CUDA's grouped_gemm
        provider.moe_permute_fusion = False
        provider.use_cpu_initialization = True
        return provider

    AutoBridge.to_megatron_provider = to_megatron_provider


def census(train_argv: list[str], script: str, result: str, *targets: str) -> int:
    """The census of the argv, then of it with each other ``--target-modules``, in one import."""
    install_stand_ins()
    module = load("bridge_census", script)
    readings = {}
    for target in ("", *targets):
        argv = list(train_argv)
        if target:
            argv[argv.index("--target-modules") + 1] = target
        provider, chunks = module.build_meta_model(bridge_namespace(argv))
        readings[target] = {"ok": True, "argv": argv, **module.census(provider, chunks)}
    Path(result).write_text(json.dumps(readings, sort_keys=True), encoding="utf-8")
    return 0


# ---- history: miles' own metric-history code on a history export -----------------------


def history(test_path: str, candidate_json: str) -> int:
    """Each exported run merged, judged alone and stored as upstream's ``run_gate_hook`` does;
    the candidate logged by ``CiHistoryBackend`` and gated against that store."""
    from miles.utils.tracking_utils.ci_history import RECORD_DIR_ENV, CiHistoryBackend

    from tests.ci.ci_register import ut_parse_one_file
    from tests.ci.ci_utils import _merge_attempt_records
    from tests.ci.metric_history import (
        MetricSample,
        RunIdentity,
        RunProvenance,
        SQLiteMetricHistoryStore,
    )
    from tests.ci.metric_history.gate import GateStatus, evaluate_gate

    scratch = Path(tempfile.mkdtemp())

    def merged(record_dir: str | Path) -> str:
        out = scratch / f"{len(list(scratch.iterdir()))}.merged.jsonl"
        _merge_attempt_records(str(record_dir), str(out))
        return str(out)

    registry = ut_parse_one_file(test_path)[0]
    store = SQLiteMetricHistoryStore(":memory:")
    loaded = []
    for line in Path("runs.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        reading = evaluate_gate(
            test_path, merged(row["record_dir"]), SQLiteMetricHistoryStore(), registry=registry
        )
        values, seen = [], set()
        for m in reading.metrics:
            coordinate = (m.metric_key, m.steps_key, m.constraint_key, m.step)
            if m.current is not None and coordinate not in seen:
                seen.add(coordinate)
                values.append(MetricSample(*coordinate, m.current))
        provenance = ("commit_sha", "pr_number", "github_run_id", "github_run_attempt")
        store.write_run(
            RunIdentity(row["test_path"], row["backend"], row["suite"]),
            RunProvenance(**{name: row[name] for name in (*provenance, "event_name", "ref")}),
            row["created_at"],
            trusted=row["trusted"],
            values=values,
        )
        errors = [m.reason for m in reading.metrics if m.historical_status is GateStatus.ERROR]
        loaded.append({"run_id": row["miles_amd"]["run_id"], "errors": errors})
    os.environ[RECORD_DIR_ENV] = str(scratch / "candidate" / "attempt-1")
    backend = CiHistoryBackend()
    backend.init(None)
    for step, metrics in json.loads(Path(candidate_json).read_text(encoding="utf-8")).items():
        backend.log(metrics, step=int(step))
    backend.finish()
    result = evaluate_gate(test_path, merged(os.environ[RECORD_DIR_ENV]), store)
    metrics = [
        {
            "metric": m.metric_key,
            "step": m.step,
            "status": m.historical_status.value,
            "baseline_n": m.baseline_n,
            "reason": m.reason,
        }
        for m in result.metrics
    ]
    identity = [result.test_path, result.backend, result.suite]
    gate = {"identity": identity, "trusted": result.trusted, "metrics": metrics}
    print(json.dumps({"loaded": loaded, "gate": gate}))
    return 0


def main(tokens: list[str]) -> int:
    command, rest = tokens[0], tokens[1:]
    if command == "train":
        return train(rest[0], rest[1:])
    split = rest.index("--") if "--" in rest else len(rest)
    own, train_argv = rest[:split], rest[split + 1 :]
    if command == "batch":
        return batch(*own)
    if command == "semantics":
        return semantics(train_argv, *own)
    if command == "census":
        return census(train_argv, *own)
    return history(*own)


if __name__ == "__main__":
    # sys.path[0] is this folder: drop it, so the tier's modules never shadow one miles imports
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(
        os.path.abspath(__file__)
    ):
        sys.path.pop(0)
    sys.exit(main(sys.argv[1:]))
