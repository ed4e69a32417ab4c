"""Wall time to both verdicts on the two-node rehearsal cluster: sequential vs concurrent.

Starts the two-node CPU cluster of ``tests.support.two_node`` (a head and a joined
raylet, each a fake whole MI355X node, node-private evidence dirs), then runs both variants'
replays of the embedded jvvnhop9 run through the real driver, pull-back and gate:

- sequential: one variant after the other (what one 8-GPU node does today);
- concurrent: ``execute_variants``, one node each.

Then the pull-back's throughput: a job writes ``--pull-mb`` MB of event-file-like bytes on
its node, and one full :class:`~miles_amd.run.pullback.PullBack` pull brings it back
verified (sha256). Every process of both nodes is stopped by pid at the end.

Usage: ``python benchmarks/bench_cluster.py [--pace S] [--pull-mb N] [--quick]``
(``--quick``, for CI's ``benchmarks/run_quick.py``: pace 0.1 s, a 1 s watch interval and a
1 MB pull; the same runs and checks). Prints one line
per phase; the last line is ``sequential_s=… concurrent_s=… ratio=…`` followed by the
pull-back figure on the line before it. Exit 1 when a run did not pass.

Figures it printed: docs/ci.md ("What the CPU suite and the benchmarks measure").
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

# ``python benchmarks/<name>.py`` puts benchmarks/ first on the path; tests.support needs the repo.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_amd.app.baselines import load, watch_rules
from miles_amd.app.gate import gate_run_dir
from miles_amd.recipe.plan import NODE_RESOURCE, NODE_ROOT_VAR, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.driver import RunOutcome, execute
from miles_amd.run.pullback import PullBack
from miles_amd.run.variants_run import PATCHED_DIR_VAR, execute_variants, variant_env
from miles_amd.run_dir import RunDir
from tests.support.rehearsal import EXAMPLE_RUN, replay_prefix
from tests.support.two_node import TwoNodeCluster, start_cluster


def plans(cluster: TwoNodeCluster, root: Path, tag: str, pace_s: float) -> dict:
    env = {**cluster.client_env(os.environ), PATCHED_DIR_VAR: str(root / "aiter-patched")}
    return {
        v: build_train_plan(
            Recipe(num_rollout=20),
            variant_env(env, v),
            run_dir=str(root / tag / v),
            entrypoint_prefix=replay_prefix(EXAMPLE_RUN, pace_s=pace_s),
            node_root="${" + NODE_ROOT_VAR + "}",
            run_id=tag,
        )
        for v in ("stock", "patched")
    }


def passed(results: dict) -> bool:
    """Every variant's run gated PASS against the patched baseline (the replay is the patched
    run, so both variants are judged by it)."""
    patched = load("patched", "--gate")
    return all(
        isinstance(r, RunOutcome) and gate_run_dir(r.run_dir, patched).verdict.verdict == "pass"
        for r in results.values()
    )


def pull_throughput(cluster: TwoNodeCluster, root: Path, megabytes: int) -> tuple[int, float]:
    """Bytes and seconds of one full, verified pull of ``megabytes`` written on a node."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(
        cluster.dashboard_url, headers={"Authorization": f"Bearer {cluster.token}"}
    )
    node_dir = "${" + NODE_ROOT_VAR + "}/bench-pull"
    size = megabytes * 1024 * 1024
    code = (
        f"import os; d=os.path.expandvars({node_dir!r})+'/tensorboard'; "
        "os.makedirs(d, exist_ok=True); "
        f"open(d+'/events.out.tfevents.bench','wb').write(os.urandom({size}))"
    )
    job_id = client.submit_job(
        entrypoint=shlex.join([sys.executable, "-c", code]),
        entrypoint_resources={NODE_RESOURCE: 1},
    )
    while str(client.get_job_status(job_id).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        time.sleep(0.3)
    run_dir = RunDir(root / "pull")
    run_dir.root.mkdir(parents=True)
    pull = PullBack(client, job_id, node_dir, run_dir)
    began = time.perf_counter()
    error = pull.final()
    seconds = time.perf_counter() - began
    if error:
        raise SystemExit(error)
    pulled = sum(f.stat().st_size for f in (run_dir.root / "tensorboard").iterdir())
    if pulled != size:
        raise SystemExit(f"pulled {pulled} bytes, the node wrote {size}")
    return pulled, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pace", type=float, default=0.5, help="seconds per replayed rollout")
    parser.add_argument("--pull-mb", type=int, default=8, help="MB for the pull-back figure")
    parser.add_argument(
        "--quick", action="store_true", help="CI: pace 0.1 s, 1 MB (overrides both flags)"
    )
    args = parser.parse_args()
    if args.quick:
        args.pace, args.pull_mb = 0.1, 1
    root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cluster = start_cluster(os.environ)
    ok = True
    try:
        interval = 1.0 if args.quick else 2.0
        common = {"timeout_s": 600, "watch_interval_s": interval, "echo": lambda _line: None}
        watch = watch_rules(load("patched", "--gate"))
        started = time.monotonic()
        sequential = {
            v: execute(plan, watch=watch, state_dir=str(root / "s"), **common)
            for v, plan in plans(cluster, root, "seq", args.pace).items()
        }
        sequential_s = time.monotonic() - started
        both = passed(sequential)  # gates each run once
        ok &= both
        print(f"sequential: {sequential_s:.1f} s, both pass: {both}", flush=True)
        started = time.monotonic()
        concurrent = execute_variants(
            plans(cluster, root, "con", args.pace),
            {"stock": watch, "patched": watch},
            state_dir=str(root / "s"),
            **common,
        )
        concurrent_s = time.monotonic() - started
        both = passed(concurrent)  # gates each run once
        ok &= both
        print(f"concurrent: {concurrent_s:.1f} s, both pass: {both}", flush=True)
        size, seconds = pull_throughput(cluster, root, args.pull_mb)
        print(
            f"pull-back: {size / 2**20:.1f} MiB verified in {seconds:.1f} s "
            f"({size / 2**20 / seconds:.2f} MiB/s, one Ray job incl. start)"
        )
        ratio = concurrent_s / sequential_s
        print(f"sequential_s={sequential_s:.1f} concurrent_s={concurrent_s:.1f} ratio={ratio:.2f}")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
