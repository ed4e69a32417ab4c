"""Both aiter variants at once on a Ray cluster: one job per variant, one node each.

Ctrl-C or an error stops every job still running. Explained in ``docs/cluster.md``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from miles_amd.recipe.plan import LaunchPlan
from miles_amd.run.driver import RunOutcome, execute
from miles_amd.variants import PATCHED_DIR_VAR

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence

Watch = Callable[["RunEvidence"], Sequence[object]]

T = TypeVar("T")


class VariantsError(ValueError):
    """The variants cannot run as asked (bad input: nothing submitted)."""


def variant_env(env: Mapping[str, str], variant: str) -> dict[str, str]:
    if variant == "patched" and not env.get(PATCHED_DIR_VAR):
        raise VariantsError(
            f"{PATCHED_DIR_VAR} is not set: the patched variant needs the dir of its aiter "
            "build on the nodes (it is put on the job's PYTHONPATH)"
        )
    return dict(env)


def execute_variants(
    plans: Mapping[str, LaunchPlan],
    watches: Mapping[str, Watch],
    *,
    timeout_s: float,
    watch_interval_s: float = 10.0,
    state_dir: str | None = None,
    echo: Callable[[str], None] = print,
) -> dict[str, RunOutcome | BaseException]:
    """Run every plan at once, each watched by ``watches[variant]``; a raised driver's
    exception is its result. Before anything is submitted: ``ClusterError`` without a node per
    plan, ``DashboardError`` for an unreachable cluster."""
    from miles_amd.run.cluster import check_cluster
    from miles_amd.run.dashboard import jobs_client, token_headers

    first = next(iter(plans.values()))
    if first.ray_address is None:
        raise VariantsError("--variants needs a Ray cluster (--ray-address): one node each")
    headers = token_headers(first.ray_auth_token_path)
    jobs_client(first.ray_address, headers)  # a missing/wrong token is named first
    check_cluster(first.ray_address, headers, gpus=first.recipe.num_gpus, count=len(plans))
    tasks = {
        variant: functools.partial(
            execute,
            plan,
            timeout_s=timeout_s,
            watch=watches[variant],
            watch_interval_s=watch_interval_s,
            state_dir=state_dir,
            echo=functools.partial(_prefixed, echo, f"[{variant}] "),
        )
        for variant, plan in plans.items()
    }
    return run_each(tasks)


def _prefixed(echo: Callable[[str], None], prefix: str, line: str) -> None:
    echo(prefix + line)


def run_each(tasks: Mapping[str, Callable[..., T]]) -> dict[str, T | BaseException]:
    """Every task in its own thread with one shared ``cancel=`` event; a raised exception is
    its task's result. Ctrl-C sets ``cancel``, waits for every task, re-raises. Waits are on
    events: a Ctrl-C in ``Thread.join`` marks the thread ended while it runs (cpython#90882)."""
    cancel = threading.Event()
    results: dict[str, T | BaseException] = {}
    ended = {name: threading.Event() for name in tasks}

    def run(name: str, task: Callable[..., T]) -> None:
        try:
            results[name] = task(cancel=cancel)
        except BaseException as exc:  # reported as this task's result
            results[name] = exc
        finally:
            ended[name].set()

    for name, task in tasks.items():
        threading.Thread(target=run, args=(name, task), name=f"variant-{name}").start()
    try:
        for event in ended.values():
            while not event.wait(timeout=0.5):  # SIGINT taken by another thread does not
                pass  # wake this wait: Python raises it here at the next timeout
    except BaseException:
        cancel.set()  # Ctrl-C: every driver stops its job and writes its end
        for event in ended.values():
            event.wait()
        raise
    return results
