"""``miles-amd train --variants stock,patched``: aiter variants at once on a Ray cluster.

Decides the option's parsing and the command's output and exit code: one run dir per variant
under ``--run-dir``, one summary line each, then the A/B comparison of every other variant
against stock (``miles_amd.app.compare``, printed like ``miles-amd compare``'s; B is patched
or rccl); the exit code is the worst of the variants' (and of the comparison's, when it ran:
2 when a run dir has no metric to compare). Running and gating each against its baseline
(rccl: stock's, applied baseline-free) is ``miles_amd.app.train.run_variants``'s. Bad input
(an unknown variant, no cluster, no ``AITER_PATCHED_DIR``, too few suitable nodes) is one
line and exit 2 with nothing submitted.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from miles_amd.cli.errors import error_line, fail, say
from miles_amd.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from miles_amd.recipe.plan import build_train_plan, format_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run_dir import RunDir
from miles_amd.variants import AITER_VARIANTS


def parse_variants(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in names if v not in AITER_VARIANTS]
    if not names or unknown or len(set(names)) != len(names):
        fail(f"--variants {value}: give distinct names from {', '.join(AITER_VARIANTS)}")
    return names


def run_variants(
    recipe: Recipe,
    run_dir: Path,
    variants: tuple[str, ...],
    *,
    require_env: bool,
    timeout: float,
    dry_run: bool,
    as_json: bool,
    env: dict[str, str],
    node_root: str | None,
) -> None:
    from miles_amd.run.variants_run import VariantsError, variant_env

    if not env.get("RAY_ADDRESS"):
        fail("--variants needs a Ray cluster: pass --ray-address (one whole node per variant)")
    try:
        plans = {
            v: build_train_plan(
                recipe,
                variant_env(env, v),
                run_dir=str(RunDir(run_dir).variant(v).root),
                node_root=node_root,
                aiter_variant=v,
            )
            for v in variants
        }
    except VariantsError as exc:
        fail(str(exc))
    if dry_run:
        if as_json:
            typer.echo(json.dumps({v: p.to_dict() for v, p in plans.items()}, indent=2))
        else:
            typer.echo("\n\n".join(f"# variant {v}\n{format_plan(p)}" for v, p in plans.items()))
        return
    raise typer.Exit(_execute(plans, run_dir, require_env, timeout))


def _execute(plans: dict, run_dir: Path, require_env: bool, timeout: float) -> int:
    from miles_amd.app.compare import NoMetricsError, compare_run_dirs
    from miles_amd.app.errors import AppError
    from miles_amd.app.train import TrainResult, run_variants
    from miles_amd.report.compare_report import render
    from miles_amd.run.cluster import ClusterError
    from miles_amd.run.dashboard import DashboardError
    from miles_amd.run.variants_run import VariantsError

    try:
        results = run_variants(plans, timeout_s=timeout, require_env=require_env, echo=typer.echo)
    except (AppError, ClusterError, DashboardError, VariantsError) as exc:
        fail(str(exc))
    code = 0
    for variant, result in results.items():
        if isinstance(result, TrainResult):
            say(f"{variant}: {result.summary()}")
            code = max(code, result.exit_code)
        else:
            typer.echo(error_line(f"{variant}: could not run: {result}"), err=True)
            code = max(code, EXIT_FAILED)
    root = RunDir(run_dir)
    for other in [v for v in plans if v != "stock"] if "stock" in plans else []:
        b = results[other]
        if not isinstance(b, TrainResult) or b.gate is None:
            continue  # this variant did not run to a verdict: said above
        try:
            compared = compare_run_dirs(
                root.variant("stock").root, root.variant(other).root, b.gate.baseline
            )
        except NoMetricsError as exc:
            typer.echo(error_line(f"compare --run-dir {exc}; no comparison"), err=True)
            return max(code, EXIT_BAD_INPUT)
        except OSError as exc:
            typer.echo(error_line(f"compare: cannot write the comparison ({exc})"), err=True)
            return max(code, EXIT_BAD_INPUT)
        typer.echo(render(compared.comparison, "text"), nl=False)
        say(f"comparison written to {compared.files.markdown}")
    return code
