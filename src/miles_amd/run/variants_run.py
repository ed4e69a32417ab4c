"""Both aiter variants at once on a Ray cluster: one job per variant, one node each.

Decides how ``train --variants stock,patched`` runs: each variant gets its own run dir
(``<run-dir>/<variant>``), its own plan and runtime env, and its own gate baseline (the
baseline of its name unless told otherwise); the cluster must have one suitable node per
variant before anything is submitted (``miles_amd.run.cluster``, count = variants); the
jobs run concurrently, each followed by the real driver in its own thread (each job asks for
the whole-node resource, so Ray puts them on different nodes); Ctrl-C or an error stops
every job still running (each driver gets the same ``cancel`` event); the overall timeout
is each driver's. After both verdicts the A/B comparison runs (:func:`ab_compare`: the
function ``miles-amd compare`` calls, ``miles_amd.report.compare_run``).

The patched variant's runtime env: ``AITER_PATCHED_DIR`` (a dir on the nodes holding the
patched aiter build, importable as ``aiter``) is put on the job's ``PYTHONPATH`` (after the
miles and Megatron checkouts, which hold no ``aiter``; every ``PYTHONPATH`` entry precedes
site-packages, where the image's stock aiter is), so the patched job imports that build and
the stock job the image's. The dir must exist at that path on every node that may take the
patched job (the cluster decides the node). It does not judge or compare runs itself.

Explained for people in ``docs/cluster.md``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.recipe.plan import LaunchPlan
from miles_amd.run.driver import RunOutcome, execute

if TYPE_CHECKING:
    from miles_amd.report.compare_run import ComparedRuns
    from miles_amd.rules.model import Baseline

PATCHED_DIR_VAR = "AITER_PATCHED_DIR"


class VariantsError(ValueError):
    """The variants cannot run as asked (bad input: nothing submitted)."""


def variant_env(env: Mapping[str, str], variant: str) -> dict[str, str]:
    """The launch env of one variant: the patched one with its aiter build on PYTHONPATH."""
    out = dict(env)
    if variant == "patched":
        patched = env.get(PATCHED_DIR_VAR)
        if not patched:
            raise VariantsError(
                f"{PATCHED_DIR_VAR} is not set: the patched variant needs the dir of its aiter "
                "build on the nodes (it is put on the job's PYTHONPATH)"
            )
        out["PYTHONPATH"] = ":".join(p for p in (patched, env.get("PYTHONPATH", "")) if p)
    return out


def execute_variants(
    plans: Mapping[str, LaunchPlan],
    baselines: Mapping[str, Baseline | str],
    *,
    timeout_s: float,
    require_env: bool = False,
    watch_interval_s: float = 10.0,
    state_dir: str | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, RunOutcome | BaseException]:
    """Run every plan concurrently, each gated against ``baselines[variant]``.

    ``ClusterError`` (before anything is submitted) when the cluster lacks a node per plan,
    ``DashboardError`` when it cannot be reached or refuses the token.
    A variant whose driver raised has its exception as its result; the others keep theirs.
    """
    _check_nodes(plans)
    cancel = threading.Event()
    results: dict[str, RunOutcome | BaseException] = {}

    def run(variant: str, plan: LaunchPlan) -> None:
        try:
            results[variant] = execute(
                plan,
                timeout_s=timeout_s,
                baseline=baselines[variant],
                require_env=require_env,
                watch_interval_s=watch_interval_s,
                state_dir=state_dir,
                echo=lambda line: echo(f"[{variant}] {line}"),
                cancel=cancel,
            )
        except BaseException as exc:  # reported as this variant's result
            results[variant] = exc

    threads = [
        threading.Thread(target=run, args=item, name=f"variant-{item[0]}") for item in plans.items()
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(timeout=0.5)
    except BaseException:
        cancel.set()  # Ctrl-C: every driver stops its job and writes its end
        for thread in threads:
            thread.join()
        raise
    return results


def _check_nodes(plans: Mapping[str, LaunchPlan]) -> None:
    from miles_amd.run.cluster import check_cluster
    from miles_amd.run.dashboard import jobs_client, token_headers

    first = next(iter(plans.values()))
    if first.ray_address is None:
        raise VariantsError("--variants needs a Ray cluster (--ray-address): one node each")
    headers = token_headers(first.ray_auth_token_path)
    jobs_client(first.ray_address, headers)  # a missing/wrong token is named first
    check_cluster(first.ray_address, headers, gpus=first.recipe.num_gpus, count=len(plans))


def ab_compare(stock: Path, patched: Path, baseline: Baseline) -> ComparedRuns:
    """The A/B step: ``miles-amd compare``'s function on the two run dirs (A stock, B
    patched), its files in B's ``report/compare``; ``NoMetricsError`` or ``OSError`` as
    :func:`~miles_amd.report.compare_run.compare_run_dirs` raises them."""
    from miles_amd.report.compare_run import compare_run_dirs

    return compare_run_dirs(stock, patched, baseline)
