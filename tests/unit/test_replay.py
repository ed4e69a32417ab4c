"""The replay entrypoint and its fault catalogue.

The replay runs as a real subprocess (``python -m miles_amd.testing.replay``, pace 0) on a
real source
run directory written by ``MilesRunWriter``, and its output is read back with the project's
strict readers (``load_run``) and TensorBoard's own ``EventAccumulator`` as a cross-check.
The pure parts (argv reconstruction, fault transforms, record cut) are tested directly.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from miles_amd.evidence.ci_history import read_ci_history_dir
from miles_amd.evidence.load import load_run
from miles_amd.evidence.tensorboard import EventFileError, read_tensorboard_dir
from miles_amd.evidence.types import RunEvidence, SeriesMap
from miles_amd.recipe.settings import Hardware, Recipe, RecipeError
from miles_amd.testing.faults import (
    ABS_DIFF,
    FAULTS,
    KL,
    PUBLISHED_KL_MEAN,
    RAW_REWARD,
    SPIKE_VALUE,
    FaultError,
    FaultPlan,
    check_fault_at,
    fatal_sentinel_line,
    final_record_cut,
    healthy_kl,
    known_sentinel_lines,
    off_batch_reward,
    plan_fault,
    transform_series,
)
from miles_amd.testing.miles_writer import CI_CAPTURED_KEYS, STEP_KEYS, ActorPids, MilesRunWriter
from miles_amd.testing.replay import REQUIRED_KEYS, rollout_metrics, source_rollouts
from miles_amd.testing.replay_argv import (
    ReplayRefused,
    argv_difference,
    check_argv,
    recipe_from_argv,
)
from tests.constants import EXAMPLE

SOURCE_ROLLOUTS = 5
K = 2  # the fault rollout of the subprocess tests
PIDS = ActorPids.around(4000)


def source_metrics(k: int) -> dict[str, float]:
    """A plausible rollout of the recipe: every gate key and a few others miles logs."""
    return {
        "perf/rollout_time": 180.25 + k,
        "rollout/response_len/mean": 2920.0 + 3 * k,
        "rollout/truncated_ratio": (26 + k) / 64,
        "rollout/raw_reward": (32 + 3 * k) / 64,
        "rollout/log_probs": -0.3125 - k / 64,
        "train/loss": 0.0123 + k / 1000,
        "train/pg_clipfrac": 0.0,
        "train/train_rollout_logprob_abs_diff": 0.0208 - k / 1000,
        "train/train_rollout_kl": 6.95e-4 + k * 1e-5,
        "train/grad_norm": 0.125 + k / 8,
        "train/ppo_kl": 0.0,
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("source")
    with (root / "job.log").open("w") as log:
        writer = MilesRunWriter(root / "tensorboard", root / "ci_history", log, pids=PIDS)
        for k in range(SOURCE_ROLLOUTS):
            writer.emit_rollout(k, source_metrics(k))
        writer.close()
    (root / "job.json").write_text(json.dumps({"job_id": "raysubmit_src", "status": "SUCCEEDED"}))
    return root


@pytest.fixture(scope="module")
def source_series(source: Path) -> SeriesMap:
    evidence = load_run(source)
    assert evidence.problems == () and evidence.conflicts == ()
    return metrics_only(evidence.series)


def metrics_only(series: SeriesMap) -> SeriesMap:
    return {key: points for key, points in series.items() if key not in STEP_KEYS}


def f32(value: float) -> float:
    return struct.unpack("<f", struct.pack("<f", value))[0]


def replay_env(run_dir: Path, *, drop: tuple[str, ...] = ()) -> dict[str, str]:
    env = dict(os.environ)
    env["TENSORBOARD_DIR"] = str(run_dir / "tensorboard")
    env["MILES_CI_GATE_RECORD_DIR"] = str(run_dir / "ci_history")
    for name in drop:
        env.pop(name, None)
    return env


def replay_cmd(source: Path, argv: list[str], *options: str) -> list[str]:
    prefix = ["--replay-source", str(source), "--replay-pace", "0", *options]
    return [sys.executable, "-m", "miles_amd.testing.replay", *prefix, *argv]


def capture_argv(num_rollout: int = SOURCE_ROLLOUTS, **fields: object) -> list[str]:
    return Recipe(num_rollout=num_rollout, capture_metrics=True, **fields).argv()  # type: ignore[arg-type]


def run_replay(
    run_dir: Path, source: Path, argv: list[str], *options: str, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run the replay; its stdout becomes the run dir's ``job.log`` as the driver stores it."""
    proc = subprocess.run(
        replay_cmd(source, argv, *options),
        env=replay_env(run_dir, drop=drop),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 2:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "job.log").write_text(proc.stdout)
    return proc


def steps(series: SeriesMap, key: str) -> list[int]:
    return [step for step, _ in series[key]]


def prefix(series: SeriesMap, n: int) -> SeriesMap:
    return {key: points[:n] for key, points in series.items()}


# ---- healthy replays --------------------------------------------------------------------


@pytest.fixture(scope="module")
def healthy(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("healthy")
    proc = run_replay(run_dir, source, capture_argv())
    assert proc.returncode == 0, proc.stderr
    return run_dir, proc.stdout


def test_healthy_replay_is_a_clean_run_dir_equal_to_the_source(
    healthy: tuple[Path, str], source_series: SeriesMap
) -> None:
    run_dir, _ = healthy
    evidence = load_run(run_dir)
    assert evidence.problems == () and evidence.conflicts == ()
    assert metrics_only(evidence.series) == source_series
    assert metrics_only(read_tensorboard_dir(run_dir / "tensorboard")) == source_series
    assert all(evidence.sources[key] == "tensorboard" for key in source_series)
    assert [hit for hit in evidence.sentinels if hit.severity == "fatal"] == []


def test_healthy_replay_cross_checked_with_event_accumulator(
    healthy: tuple[Path, str], source_series: SeriesMap
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = healthy
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == sorted(source_series)
    for key, points in source_series.items():
        assert tuple((e.step, e.value) for e in acc.Scalars(key)) == points


def test_healthy_replay_ci_history_is_miles_form(
    healthy: tuple[Path, str], source_series: SeriesMap
) -> None:
    run_dir, _ = healthy
    records = sorted((run_dir / "ci_history").iterdir(), key=lambda p: p.stat().st_size)
    assert all(re.fullmatch(r"\d+-[0-9a-f]{32}\.jsonl", p.name) for p in records)
    driver, record = records  # the driver's finish_tracking leaves a 0-byte record
    assert driver.stat().st_size == 0
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [line["metric"] for line in lines] == [
        "rollout/raw_reward",
        *[key for key in CI_CAPTURED_KEYS if key.startswith("train/")],
    ]
    for line in lines:
        assert set(line) == {"metric", "series"}
        assert [tuple(p) for p in line["series"]] == list(source_series[line["metric"]])


def test_healthy_replay_log_is_miles_lines(healthy: tuple[Path, str]) -> None:
    run_dir, log = healthy
    lines = log.splitlines()
    assert "miles_amd replay of" in lines[0]
    metric_lines = lines[1:]
    assert len(metric_lines) == 4 * SOURCE_ROLLOUTS
    actor_line = re.compile(
        r"\x1b\[36m\((RolloutManager|MegatronTrainRayActor) pid=\d+\)\x1b\[0m "
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (?:rollout_manager|actor_cell0_rank0)\] "
        r"[\w.]+:\d+ - (perf|rollout|step) (\d+): \{.*\}"
    )
    kinds = [actor_line.fullmatch(line) for line in metric_lines]
    assert all(kinds), metric_lines
    assert [(m.group(2), int(m.group(3))) for m in kinds] == [  # type: ignore[union-attr]
        (kind, k) for k in range(SOURCE_ROLLOUTS) for kind in ("perf", "rollout", "step", "step")
    ]
    assert all(m.group(1) == "RolloutManager" for m in kinds if m.group(2) == "perf")  # type: ignore[union-attr]
    assert "TENSORBOARD_DIR" not in log and str(run_dir) not in log  # no env value printed


def test_replay_of_fewer_rollouts_replays_the_first_ones(
    source: Path, source_series: SeriesMap, tmp_path: Path
) -> None:
    proc = run_replay(tmp_path, source, capture_argv(num_rollout=3))
    assert proc.returncode == 0, proc.stderr
    evidence = load_run(tmp_path)
    assert evidence.problems == ()
    assert metrics_only(evidence.series) == prefix(source_series, 3)


@pytest.mark.skipif(not EXAMPLE.is_dir(), reason="the embedded example is not built yet")
def test_replay_of_the_embedded_example(tmp_path: Path) -> None:
    example = metrics_only(load_run(EXAMPLE).series)
    proc = run_replay(tmp_path, EXAMPLE, capture_argv(num_rollout=20))
    assert proc.returncode == 0, proc.stderr
    evidence = load_run(tmp_path)
    assert evidence.problems == () and evidence.conflicts == ()
    assert metrics_only(evidence.series) == example
    assert len(example[ABS_DIFF]) == 20


def test_replay_without_capture_flags_writes_only_the_log(source: Path, tmp_path: Path) -> None:
    proc = run_replay(tmp_path, source, Recipe(num_rollout=2).argv())
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.log"]
    assert steps(load_run(tmp_path).series, ABS_DIFF) == [0, 1]


# ---- faults, end to end -----------------------------------------------------------------


def fault_run(
    source: Path, run_dir: Path, kind: str
) -> tuple[subprocess.CompletedProcess[str], RunEvidence]:
    proc = run_replay(
        run_dir, source, capture_argv(), "--replay-fault", kind, "--replay-fault-at", str(K)
    )
    return proc, load_run(run_dir)


def test_fault_spike(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "spike")
    assert proc.returncode == 0, proc.stderr
    assert evidence.problems == () and evidence.conflicts == ()
    assert evidence.series[ABS_DIFF][K] == (K, SPIKE_VALUE)
    assert read_ci_history_dir(tmp_path / "ci_history")[ABS_DIFF][K] == (K, SPIKE_VALUE)
    others = [p for p in evidence.series[ABS_DIFF] if p[0] != K]
    assert others == [p for p in source_series[ABS_DIFF] if p[0] != K]
    assert evidence.series[RAW_REWARD] == source_series[RAW_REWARD]


def test_fault_nan(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "nan")
    assert proc.returncode == 0, proc.stderr
    assert evidence.problems == () and evidence.conflicts == ()
    for series in (
        evidence.series,
        read_tensorboard_dir(tmp_path / "tensorboard"),
        read_ci_history_dir(tmp_path / "ci_history"),
    ):
        assert math.isnan(series[ABS_DIFF][K][1])
    assert f"'{ABS_DIFF}': nan" in proc.stdout
    assert evidence.series[ABS_DIFF][K + 1] == source_series[ABS_DIFF][K + 1]


def test_fault_crash(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "crash")
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "RuntimeError" in proc.stderr
    assert evidence.problems == ()
    # Rollouts 0..K-1 were emitted and flushed; miles' CI snapshot survives a crash too.
    assert metrics_only(evidence.series) == prefix(source_series, K)
    assert steps(read_ci_history_dir(tmp_path / "ci_history"), ABS_DIFF) == list(range(K))


def test_fault_short(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "short")
    assert proc.returncode == 0, proc.stderr
    assert evidence.problems == ()
    assert metrics_only(evidence.series) == prefix(source_series, K)
    assert f" - step {K}:" not in proc.stdout and f" - step {K - 1}:" in proc.stdout


def test_fault_fatal_sentinel(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "fatal-sentinel")
    assert proc.returncode == 0, proc.stderr
    (hit,) = [h for h in evidence.sentinels if h.severity == "fatal"]
    assert hit.name == "sglang_lora_skips_moe" and hit.count == 1
    lines = proc.stdout.splitlines()
    assert f" - perf {K}:" in lines[hit.first_line]  # printed right before rollout K
    assert metrics_only(evidence.series) == source_series


def test_fault_known_sentinel(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "known-sentinel")
    assert proc.returncode == 0, proc.stderr
    (hit,) = evidence.sentinels
    assert (hit.name, hit.severity, hit.count) == ("megatron_moe_router_not_fp32", "known", 8)
    pids = re.findall(r"\(MegatronTrainRayActor pid=(\d+)\)\S* .*fp32 routing", proc.stdout)
    assert len(set(pids)) == 8
    assert metrics_only(evidence.series) == source_series


def test_fault_no_tensorboard(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "no-tensorboard")
    assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.rglob("*tfevents*"))
    assert "tensorboard" not in evidence.sources.values()
    assert read_ci_history_dir(tmp_path / "ci_history")[ABS_DIFF] == source_series[ABS_DIFF]


def test_fault_truncated_event(source: Path, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "truncated-event")
    assert proc.returncode == 0, proc.stderr
    with pytest.raises(EventFileError):
        read_tensorboard_dir(tmp_path / "tensorboard")
    assert [p.source for p in evidence.problems] == ["tensorboard"]
    event_file = max((tmp_path / "tensorboard").iterdir(), key=lambda p: p.stat().st_size)
    with pytest.raises(ValueError, match="no complete final record"):
        final_record_cut(event_file.read_bytes())
    # A live read drops exactly the cut record: the last scalar of the last rollout.
    live = read_tensorboard_dir(tmp_path / "tensorboard", live=True)
    total = sum(len(points) for points in live.values())
    assert total == SOURCE_ROLLOUTS * len(source_metrics(0)) - 1


def test_fault_reward_collapse(source: Path, source_series: SeriesMap, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "reward-collapse")
    assert proc.returncode == 0, proc.stderr
    rewards = evidence.series[RAW_REWARD]
    assert rewards[:K] == source_series[RAW_REWARD][:K]
    assert [v for _, v in rewards[K:]] == [0.0] * (SOURCE_ROLLOUTS - K)


def test_fault_wrong_batch_shape(source: Path, tmp_path: Path) -> None:
    proc, evidence = fault_run(source, tmp_path, "wrong-batch-shape")
    assert proc.returncode == 0, proc.stderr
    for series in (evidence.series, read_ci_history_dir(tmp_path / "ci_history")):
        values = [v for _, v in series[RAW_REWARD]]
        assert len(values) == SOURCE_ROLLOUTS
        assert all(abs(v * 64 - round(v * 64)) > 0.3 for v in values), values
        assert all(abs(v * 48 - round(v * 48)) < 1e-5 for v in values), values


def test_fault_hang_keeps_running_after_rollout_k(source: Path, tmp_path: Path) -> None:
    cmd = replay_cmd(source, capture_argv(), "--replay-fault", "hang", "--replay-fault-at", str(K))
    proc = subprocess.Popen(
        cmd, env=replay_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = threading.Event()
    lines: list[str] = []

    def follow() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if f" - step {K}:" in line:
                seen.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    try:
        assert seen.wait(60), "".join(lines)
        time.sleep(1.0)
        assert proc.poll() is None, "the hang fault exited"
        assert steps(read_tensorboard_dir(tmp_path / "tensorboard"), ABS_DIFF) == list(range(K + 1))
        assert not any(f" - step {K + 1}:" in line for line in lines)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        reader.join(30)
    assert proc.returncode == -signal.SIGKILL


# ---- refusals ---------------------------------------------------------------------------


def assert_refused(proc: subprocess.CompletedProcess[str], run_dir: Path, *named: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    for name in named:
        assert name in lines[0]
    assert not run_dir.exists() or not any(run_dir.iterdir())


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def test_refuses_more_rollouts_than_the_source_has(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, source, capture_argv(num_rollout=SOURCE_ROLLOUTS + 1))
    assert_refused(proc, run_dir, "--num-rollout 6", "5 rollouts")


def test_refuses_a_foreign_flag(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, source, [*capture_argv(), "--foo", "1"])
    assert_refused(proc, run_dir, "--foo")


def test_refuses_an_unknown_replay_option(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, source, [*capture_argv(), "--replay-speed", "2"])
    assert_refused(proc, run_dir, "--replay-speed")


def test_refuses_a_lora_rank_that_breaks_the_recipe(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, source, with_value(capture_argv(), "--lora-rank", "16"))
    assert_refused(proc, run_dir, "lora_rank 16", "sglang_max_lora_rank 32")


def test_refuses_a_changed_pinned_value(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, source, with_value(capture_argv(), "--optimizer", "sgd"))
    assert_refused(proc, run_dir, "--optimizer sgd", "--optimizer adam")


def test_refuses_without_tensorboard_dir(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, source, capture_argv(), drop=("TENSORBOARD_DIR",))
    assert_refused(proc, run_dir, "TENSORBOARD_DIR")
    assert str(run_dir) not in proc.stderr  # names the variable, never prints a value


def test_refuses_a_fault_that_cannot_fire(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    options = ("--replay-fault", "spike", "--replay-fault-at", "5")
    proc = run_replay(run_dir, source, capture_argv(), *options)
    assert_refused(proc, run_dir, "--replay-fault-at 5")


def test_refuses_an_unknown_fault(source: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, source, capture_argv(), "--replay-fault", "meteor")
    assert_refused(proc, run_dir, "--replay-fault", "meteor")


def test_refuses_an_untrustworthy_source(source: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    event_file = max((broken / "tensorboard").iterdir(), key=lambda p: p.stat().st_size)
    os.truncate(event_file, final_record_cut(event_file.read_bytes()))
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, broken, capture_argv())
    assert_refused(proc, run_dir, "--replay-source", "tensorboard")


def test_refuses_a_missing_source(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_replay(run_dir, tmp_path / "nowhere", capture_argv())
    assert_refused(proc, run_dir, "--replay-source", "nowhere")


# ---- the argv, pure ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "recipe",
    [
        Recipe(),
        Recipe(num_rollout=3, capture_metrics=True),
        Recipe(use_wandb=True, wandb_project="p", wandb_group="g", capture_metrics=True),
        Recipe(
            model_dir="/data/m",
            data_dir="rel/data",
            lr=3e-6,
            lora_rank=16,
            sglang_max_lora_rank=16,
            lora_alpha=8,
            target_modules=("up_proj",),
        ),
        Recipe(
            num_gpus=4,
            tensor_model_parallel_size=2,
            rollout_num_gpus_per_engine=2,
            sglang_mem_fraction_static=0.35,
            lora_base_cpu_backup=False,
            sglang_lora_use_virtual_experts=True,
            rollout_batch_size=16,
            n_samples_per_prompt=4,
        ),
        Recipe(hardware=Hardware.MI350X),
    ],
)
def test_recipe_from_argv_round_trips(recipe: Recipe) -> None:
    rebuilt = recipe_from_argv(recipe.argv())
    assert rebuilt.argv() == recipe.argv()
    assert check_argv(recipe.argv()) == rebuilt


def test_argv_difference_names_the_flag() -> None:
    argv = Recipe().argv()
    assert argv_difference(argv, argv) is None
    assert "--foo" in (argv_difference(argv, [*argv, "--foo"]) or "")
    without = [t for t in argv if t != "--colocate"]
    assert argv_difference(argv, without) == "--colocate: missing; the recipe passes --colocate"
    moved = argv[2:4] + argv[:2] + argv[4:]  # --hidden-size before --num-layers
    assert "out of the recipe's order" in (argv_difference(argv, moved) or "")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda a: with_value(a, "--lr", "1e-5"), "--lr 1e-5: the recipe passes --lr 1e-05"),
        (lambda a: with_value(a, "--num-rollout", "x"), "--num-rollout x: not a valid int"),
        (lambda a: [*a, "--num-rollout", "3"], "--num-rollout: given twice"),
        (lambda a: ["7", *a], "7: a value before any flag"),
        (lambda a: [*a, "--wandb-key", "SECRET"], "--wandb-key: not a flag"),
    ],
)
def test_check_argv_refuses(change, named: str) -> None:
    with pytest.raises(ReplayRefused) as info:
        check_argv(change(Recipe().argv()))
    assert named in str(info.value)
    assert "SECRET" not in str(info.value)


def test_check_argv_refuses_a_broken_invariant() -> None:
    argv = with_value(Recipe().argv(), "--global-batch-size", "32")
    with pytest.raises(ReplayRefused, match="batch shape"):
        check_argv(argv)
    with pytest.raises(RecipeError):
        recipe_from_argv(argv)


# ---- the source, pure -------------------------------------------------------------------


def test_source_rollouts_requires_complete_series() -> None:
    full: dict[str, tuple[tuple[int, float], ...]] = {
        key: ((0, 0.1), (1, 0.2)) for key in REQUIRED_KEYS
    }
    assert source_rollouts("src", full) == 2
    assert source_rollouts("src", {**full, "train/loss": ((0, 1.0),)}) == 2
    with pytest.raises(ReplayRefused, match=RAW_REWARD):
        source_rollouts("src", {k: v for k, v in full.items() if k != RAW_REWARD})
    with pytest.raises(ReplayRefused, match="duplicated or missing"):
        source_rollouts("src", {**full, ABS_DIFF: ((0, 0.1), (0, 0.1), (1, 0.2))})
    with pytest.raises(ReplayRefused, match="step 2 where step 1"):
        source_rollouts("src", {**full, "train/loss": ((0, 1.0), (2, 1.0))})


def test_rollout_metrics_groups_by_step_and_drops_step_keys() -> None:
    series = {ABS_DIFF: ((0, 0.1), (1, 0.2), (2, 0.3)), "train/step": ((0, 0.0), (1, 1.0))}
    assert rollout_metrics(series, 2) == [{ABS_DIFF: 0.1}, {ABS_DIFF: 0.2}]


# ---- the fault catalogue, pure ----------------------------------------------------------

SERIES: SeriesMap = {
    ABS_DIFF: tuple((k, 0.02) for k in range(5)),
    RAW_REWARD: tuple((k, (30 + k) / 64) for k in range(5)),
    "train/loss": tuple((k, 0.5) for k in range(5)),
}


def test_every_fault_names_its_effect_and_expected_reason() -> None:
    assert set(FAULTS) == {
        "spike", "nan", "crash", "hang", "short", "fatal-sentinel", "known-sentinel",
        "no-tensorboard", "truncated-event", "reward-collapse", "wrong-batch-shape",
        "kl-doubled",
    }  # fmt: skip
    for kind, fault in FAULTS.items():
        assert fault.kind == kind and fault.description and fault.expected
    assert [k for k, f in FAULTS.items() if not f.fails_run] == ["known-sentinel"]


def test_value_faults_change_only_their_series() -> None:
    spiked = transform_series("spike", 2, SERIES)
    assert spiked[ABS_DIFF][2] == (2, SPIKE_VALUE) and SPIKE_VALUE > 0.15
    assert [p for p in spiked[ABS_DIFF] if p[0] != 2] == [p for p in SERIES[ABS_DIFF] if p[0] != 2]
    assert spiked[RAW_REWARD] == SERIES[RAW_REWARD] and spiked["train/loss"] == SERIES["train/loss"]
    assert math.isnan(transform_series("nan", 0, SERIES)[ABS_DIFF][0][1])
    collapsed = transform_series("reward-collapse", 3, SERIES)[RAW_REWARD]
    assert collapsed == (*SERIES[RAW_REWARD][:3], (3, 0.0), (4, 0.0))


def test_kl_doubled_doubles_a_healthy_kl_from_rollout_k() -> None:
    """A source without a KL gets one at jvvnhop9's published mean, shaped by the gap (KL ~
    gap²), doubled from K; a source with one has its own doubled; nothing else changes."""
    made = transform_series("kl-doubled", 2, SERIES)
    healthy = dict(healthy_kl(SERIES[ABS_DIFF]))
    assert healthy == {k: pytest.approx(PUBLISHED_KL_MEAN) for k in range(5)}  # a flat gap
    assert made[KL] == tuple((k, healthy[k] * (2 if k >= 2 else 1)) for k in range(5))
    assert {k: v for k, v in made.items() if k != KL} == SERIES
    own = {**SERIES, KL: tuple((k, 1e-3) for k in range(5))}
    assert transform_series("kl-doubled", 0, own)[KL] == tuple((k, 2e-3) for k in range(5))
    shaped = healthy_kl(((0, 0.01), (1, 0.03)))  # mean gap 0.02: (1/2)² and (3/2)² of the mean
    assert [v for _, v in shaped] == pytest.approx(
        [PUBLISHED_KL_MEAN / 4, 9 * PUBLISHED_KL_MEAN / 4]
    )
    assert SERIES[ABS_DIFF][2] == (2, 0.02)  # the input is untouched
    assert transform_series(None, 0, SERIES) == SERIES
    assert transform_series("crash", 0, SERIES) == SERIES


def test_value_fault_without_its_series_is_an_error() -> None:
    with pytest.raises(FaultError, match=ABS_DIFF):
        transform_series("spike", 0, {RAW_REWARD: SERIES[RAW_REWARD]})


def test_wrong_batch_shape_rewards_are_48ths_never_64ths() -> None:
    for n in range(65):
        value = off_batch_reward(n / 64)
        assert 0 <= value <= 1
        assert (value * 48).is_integer() and not (value * 64).is_integer()
        assert abs(value - n / 64) <= 2 / 48
    assert math.isnan(off_batch_reward(math.nan))
    shaped = transform_series("wrong-batch-shape", 4, SERIES)[RAW_REWARD]
    assert all(not (v * 64).is_integer() for _, v in shaped)


def test_plans() -> None:
    assert plan_fault(None, 3, 20) == FaultPlan(20)
    assert plan_fault("crash", 3, 20) == FaultPlan(20, crash_before=3)
    assert plan_fault("hang", 3, 20) == FaultPlan(20, hang_after=3)
    assert plan_fault("short", 3, 20) == FaultPlan(3)
    assert plan_fault("fatal-sentinel", 3, 20).fatal_sentinel_at == 3
    assert plan_fault("known-sentinel", 99, 20).known_sentinel_at_start
    assert not plan_fault("no-tensorboard", 99, 20).write_tensorboard
    assert plan_fault("truncated-event", 0, 20).truncate_event_file
    assert plan_fault("spike", 3, 20) == FaultPlan(20)  # a value fault: emission unchanged


def test_fault_at_must_fire_within_the_run() -> None:
    check_fault_at("spike", 19, 20)
    check_fault_at("wrong-batch-shape", 99, 20)  # ignores K
    for at in (20, -1):
        with pytest.raises(FaultError, match=f"--replay-fault-at {at}"):
            check_fault_at("spike", at, 20)
    with pytest.raises(FaultError, match="unknown fault"):
        check_fault_at("meteor", 0, 20)


def test_sentinel_lines_match_the_sentinel_table(tmp_path: Path) -> None:
    fatal = fatal_sentinel_line(PIDS, 1_795_000_000.0)
    assert fatal.startswith(f"\x1b[36m(SGLangEngine pid={PIDS.sglang_engine})\x1b[0m [")
    known = known_sentinel_lines(PIDS)
    (tmp_path / "job.log").write_text("\n".join([fatal, *known]) + "\n", encoding="utf-8")
    hits = {hit.name: hit for hit in load_run(tmp_path).sentinels}
    assert hits["sglang_lora_skips_moe"].severity == "fatal"
    assert hits["sglang_lora_skips_moe"].count == 1
    assert (
        hits["megatron_moe_router_not_fp32"].severity,
        hits["megatron_moe_router_not_fp32"].count,
    ) == ("known", 8)
    assert len({line.split(")")[0] for line in known}) == 8


def test_final_record_cut_lands_inside_the_last_record(tmp_path: Path) -> None:
    import io

    writer = MilesRunWriter(tmp_path, None, io.StringIO(), pids=PIDS)
    writer.emit_rollout(0, {"train/loss": 1.0, "train/grad_norm": 2.0})
    writer.close()
    assert writer.event_file is not None
    data = writer.event_file.read_bytes()
    cut = final_record_cut(data)
    assert 0 < cut < len(data)
    writer.event_file.write_bytes(data[:cut])
    with pytest.raises(EventFileError):
        read_tensorboard_dir(tmp_path)
    assert read_tensorboard_dir(tmp_path, live=True) == {"train/loss": ((0, 1.0),)}
    with pytest.raises(ValueError):
        final_record_cut(b"")
