"""``miles-amd canary``: all-reduce known integers at the rollout shapes and check every bit.

Exit 0 clean, 1 a mismatch (the line says whether it matches ROCm/aiter#5694's stale read),
2 unusable, with nothing written. Heavy imports happen in the ranks (``canary.worker``).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import stat
import sys
import textwrap
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_amd.cli.options import AiterVariant, add_command, fail, opt, say
from miles_amd.exit_codes import EXIT_FAILED

if TYPE_CHECKING:
    from miles_amd.canary.harness import Setup
    from miles_amd.canary.plan import Plan

CPU_DETECT_RATE = 0.002
MIN_DETECT_RATE = 1e-12  # 4.6e12 calls: beyond any canary; below it (subnormals) is refused
CPU_WORLD_SIZE = 4
MAX_REPEATS = 10_000
ARM_LABELS = {"back_to_back": "b2b"}


class ImplementationChoice(str, Enum):
    aiter = "aiter"
    sglang = "sglang"
    rccl = "rccl"


def register(app: typer.Typer) -> None:
    add_command(app, "canary", canary)


def check_reducer(target: str) -> str:
    """``FILE:FUNCTION`` (absolute) whose file defines the function (read, not run)."""
    file_name, sep, func = target.rpartition(":")
    if not sep or not file_name or not func.isidentifier():
        fail(f"--reducer {target}: expected FILE:FUNCTION, e.g. reducers.py:all_reduce")
    path = Path(file_name).expanduser().absolute()
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            fail(f"--reducer {target}: {path} is not a regular file; name a Python file")
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except OSError as exc:
        fail(
            f"--reducer {target}: cannot read {path} ({exc.strerror or exc}); name an existing file"
        )
    except (SyntaxError, ValueError) as exc:
        fail(f"--reducer {target}: {path} is not valid Python ({exc}); fix the file")
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    if func not in defined:
        fail(
            f"--reducer {target}: {path} defines no top-level function {func}; "
            f"define def {func}(tensor, group)"
        )
    return f"{path}:{func}"


def check_detect_rate(value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and MIN_DETECT_RATE <= value < 1.0):
        fail(
            f"--detect-rate {value:g}: must be in [{MIN_DETECT_RATE:g}, 1), e.g. 1.3e-05 "
            "(a smaller rate needs more calls than any canary can make)"
        )
    return value


def canary(
    plan_only: Annotated[bool, opt("--plan", "Print the plan; run nothing.")] = False,
    json_out: Annotated[bool, opt("--json", "Print JSON (the plan, or the record).")] = False,
    reducer: Annotated[
        str | None,
        opt("--reducer", "CPU harness: FUNCTION(tensor, group) reduces.", "FILE:FUNCTION"),
    ] = None,
    variant: Annotated[AiterVariant | None, opt("--variant", "Whose all-reduce.")] = None,
    implementation: Annotated[
        ImplementationChoice | None, opt("--implementation", "Override the variant's.")
    ] = None,
    world_size: Annotated[int | None, opt("--world-size", "Ranks (CPU 4, node 8).", min=1)] = None,
    detect_rate: Annotated[
        float | None,
        opt("--detect-rate", "Per-call rate caught at 99%.", callback=check_detect_rate),
    ] = None,
    tokens: Annotated[str | None, opt("--tokens", "Only these token counts (a,b,...).")] = None,
    repeats: Annotated[int, opt("--repeats", "Run the plan R times.", min=1, max=MAX_REPEATS)] = 1,
    timeout: Annotated[
        float | None, opt("--timeout", "Seconds before hung ranks are killed.", min=1.0)
    ] = None,
    run_dir: Annotated[Path | None, opt("--run-dir", "Write canary.json here.")] = None,
) -> None:
    """All-reduce the recipe's rollout shapes with known sums; find any wrong bit.

    Exit 1 on a mismatch (a red canary proves the kernel wrong; a clean one bounds its rate).
    """
    from miles_amd.canary.harness import Setup
    from miles_amd.canary.kernel import CAR_MAX_SIZE_ENV, installed_constants
    from miles_amd.canary.plan import (
        CPU,
        NODE,
        SPIKE_RATE_PER_RUN,
        build_plan,
        exposed_calls_per_run,
        implied_rate,
        recipe_shape,
    )
    from miles_amd.recipe.settings import Recipe
    from miles_amd.run.probes_allreduce import read_aiter_fix
    from miles_amd.variants import aiter_pythonpath, rollout_implementation

    recipe = Recipe()
    shape = recipe_shape(recipe)
    on_cpu = reducer is not None
    if on_cpu and implementation is not None:
        fail("--reducer and --implementation exclude each other; the reducer is the implementation")
    if detect_rate is not None:
        rate, source = detect_rate, "given: --detect-rate"
    elif on_cpu:
        rate, source = CPU_DETECT_RATE, "CPU harness default"
    else:
        rate = implied_rate()
        source = (
            f"implied: a spike in {SPIKE_RATE_PER_RUN:.0%} of stock runs over "
            f"{exposed_calls_per_run()} exposed calls per run (docs/node.md, Statistics)"
        )
    label = (
        "reducer" if on_cpu else implementation.value if implementation
        else rollout_implementation(variant.value if variant else "stock")
    )  # fmt: skip
    world = world_size or (CPU_WORLD_SIZE if on_cpu else recipe.num_gpus)
    if world % shape.tp or world > recipe.num_gpus:
        fail(
            f"--world-size {world}: the plan runs TP-{shape.tp} groups on at most "
            f"{recipe.num_gpus} ranks; pass a multiple of {shape.tp} up to {recipe.num_gpus}"
        )
    reducer_path = check_reducer(reducer) if reducer is not None else None
    if run_dir is not None and run_dir.exists() and not run_dir.is_dir():
        fail(f"--run-dir {run_dir}: is a file, not a directory; name a directory")
    existing = run_dir
    while existing is not None and not existing.exists():
        existing = existing.parent
    if existing is not None and not (existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)):
        fail(f"--run-dir {run_dir}: {existing} is not writable; choose a writable directory")
    try:
        sizes = tuple(int(part) for part in tokens.split(",")) if tokens else ()
    except ValueError:
        fail(f"--tokens {tokens}: expected comma-separated token counts, e.g. 29,33")
    pythonpath = aiter_pythonpath(variant.value if variant else None, os.environ)
    aiter = read_aiter_fix(pythonpath, sys.executable)
    package, header, fix = aiter.get("package_dir"), aiter.get("header"), str(aiter["value"])
    constants = installed_constants(
        os.environ,
        package if isinstance(package, str) else None,
        header if isinstance(header, str) else None,
        fix,
    )
    if constants.car_max_size < shape.nbytes(1) and label == "aiter":
        fail(
            f"{CAR_MAX_SIZE_ENV}={os.environ.get(CAR_MAX_SIZE_ENV)} switches aiter's custom "
            "all-reduce off: aiter sends every size to RCCL, so there is no aiter kernel to test; "
            f"unset {CAR_MAX_SIZE_ENV} (or test RCCL with --implementation rccl)"
        )
    try:
        plan = build_plan(
            shape, label, rate, target=CPU if on_cpu else NODE, constants=constants,
            groups=world // shape.tp, tokens=sizes,
        )  # fmt: skip
    except ValueError as exc:
        fail(f"--tokens {tokens}: {exc}" if tokens else str(exc))
    if plan_only:
        _print_plan(plan, fix, json_out)
        return
    setup = Setup(
        world_size=world,
        device="cpu" if on_cpu else "cuda",
        implementation=label,
        reducer=reducer_path,
        variant=variant.value if variant else None,
        repeats=repeats,
        rate_source=source,
        aiter_fix=fix,
        pythonpath=pythonpath,
    )
    _run(plan, setup, timeout, run_dir, json_out)


def _print_plan(plan: Plan, fix: str, json_out: bool) -> None:
    if json_out:
        entries = [e.as_dict() for e in plan.entries]
        document = {"dispatch_source": plan.constants.source, "aiter_fix": fix, "entries": entries}
        typer.echo(json.dumps(document, indent=2))
        return
    arms = [arm for arm, _ in plan.entries[0].arms]
    typer.echo(
        f"{'N':>6} {'kernel':>6} {'lanes':>8} {'waves':>13} {'role':>7} {'calls':>8}  "
        + " ".join(f"{ARM_LABELS.get(arm, arm):>8}" for arm in arms)
    )
    for e in plan.entries:
        lanes = "unequal" if e.affected else "equal" if e.kernel == "2stage" else "-"
        typer.echo(
            f"{e.tokens:>6} {e.kernel:>6} {lanes:>8} {e.wave_class:>13} {e.role:>7} "
            f"{e.calls:>8}  " + " ".join(f"{calls:>8}" for _, calls in e.arms)
        )
    for line in (
        _power_line(plan.detect_rate, plan.exposed_calls, plan.probability),
        f"waves of {plan.wave_size} lanes (CDNA; the node run reads the GPU's); implementation "
        f"{plan.entries[0].implementation}; lanes: the lane model's trip counts; waves: "
        "kernel.wave_class (docs/node.md)",
        f"estimated time: {plan.estimated_seconds:.0f} s with {plan.groups} TP group(s) side by "
        f"side ({plan.latency.source})",
        f"dispatch_source: {plan.constants.source}",
        f"aiter_fix: {fix}",
    ):
        typer.echo(textwrap.fill(line, width=100, subsequent_indent="  ", break_on_hyphens=False))


def _power_line(rate: float, calls: int, probability: float) -> str:
    return (
        f"power: a per-call rate >= {rate:.3g} at the exposed sizes is caught with probability "
        f"{probability:.4f} (>= 0.99) by {calls} exposed calls"
    )


def _run(
    plan: Plan, setup: Setup, timeout: float | None, run_dir: Path | None, json_out: bool
) -> None:
    from miles_amd.canary.harness import (
        NOT_SEEN,
        HarnessError,
        node_facts,
        run,
        run_control,
        unusable,
        write_canary,
    )
    from miles_amd.canary.kernel import MATCHES, OTHER
    from miles_amd.canary.plan import build_plan

    on_cpu = setup.device == "cpu"
    if not on_cpu:
        facts = node_facts(setup.pythonpath or "")
        if facts.wave_size and facts.wave_size != plan.wave_size:
            plan = build_plan(
                plan.shape, setup.implementation, plan.detect_rate, constants=plan.constants,
                groups=plan.groups, tokens=tuple(e.tokens for e in plan.entries),
                wave_size=facts.wave_size,
            )  # fmt: skip
        problem = unusable(facts, setup.implementation, plan.shape.tp)
        if problem:
            fail(problem)
        if facts.gpus < setup.world_size:
            fail(
                f"--world-size {setup.world_size}: only {facts.gpus} GPU(s) visible; "
                f"pass --world-size {plan.shape.tp}"
            )
        setup = dataclasses.replace(
            setup, aiter_version=facts.aiter_version, aiter_commit=facts.aiter_commit
        )
    per_run = plan.estimated_seconds * setup.repeats
    bound = timeout or (120.0 + 10.0 * per_run if on_cpu else 600.0 + 3.0 * per_run)
    try:  # on the node the positive control's broken build runs first
        checked = None if on_cpu else run_control(plan, setup, bound)
        record = run(plan, dataclasses.replace(setup, control=checked), bound)
    except HarnessError as exc:
        fail(f"canary unusable: {exc}")
    written = None
    if run_dir is not None:
        try:
            written = write_canary(run_dir, record)
        except OSError as exc:
            fail(f"--run-dir {run_dir}: cannot write canary.json ({exc}); choose a writable dir")
    if json_out:
        typer.echo(record.to_json(), nl=False)
    else:
        for r in record.results:
            lat = f"{r.latency_us:.1f} us" if r.latency_us is not None else "-"
            typer.echo(
                f"N={r.tokens:<6} {r.kernel:>6} {r.wave_class:>13} calls={r.calls:<9} "
                f"mismatches={r.mismatches:<6} blocks={r.blocks_with_mismatch}/{r.blocks} {lat}"
            )
        power = record.power
        typer.echo(_power_line(power.detect_rate, power.exposed_calls, power.probability))
        if written is not None:
            say(f"wrote {written}")
    if record.control is not None and not record.control.caught and record.clean:
        typer.echo(f"miles-amd: canary: the control was not caught: {NOT_SEEN}", err=True)
    bad = record.first_bad()
    if bad is not None:
        first, where = bad.first_mismatch, ""
        if first is not None and first.returned is not None:
            where = f"; first at call {first.call} rank {first.rank}: returned {first.returned}"
        elif first is not None:
            where = (
                f"; first at call {first.call} rank {first.rank} element {first.index}: "
                f"expected {first.expected:g}, seen {first.seen:g}"
            )
        reading = MATCHES if record.matches_stale_read else OTHER
        typer.echo(
            f"miles-amd: canary: {record.mismatches} wrong all-reduce call(s) of "
            f"{record.implementation}: {reading}; first at N={bad.tokens} "
            f"({bad.kernel}, {bad.wave_class}){where}",
            err=True,
        )
        raise typer.Exit(EXIT_FAILED)
