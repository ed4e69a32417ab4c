"""The replay: ``main`` in-process (pace 0) on a source run written by ``MilesRunWriter``, read
back with ``load_run`` (the hang fault: tests/rehearsal, where the driver kills it); the argv
check and the value faults' arithmetic directly."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from miles_amd.evidence.ci_history import read_ci_history_dir
from miles_amd.evidence.load import load_run
from miles_amd.evidence.tensorboard import EventFileError, read_tensorboard_dir
from miles_amd.evidence.types import SeriesMap
from miles_amd.recipe.settings import Hardware, Recipe
from miles_amd.testing.faults import (
    ABS_DIFF,
    KL,
    PUBLISHED_KL_MEAN,
    RAW_REWARD,
    SPIKE_VALUE,
    FaultError,
    final_record_cut,
    healthy_kl,
    off_batch_reward,
    transform_series,
)
from miles_amd.testing.miles_writer import (
    CI_CAPTURED_KEYS,
    STEP_KEYS,
    ActorPids,
    MilesRunWriter,
)
from miles_amd.testing.real_writers import MilesSourceError, source_line
from miles_amd.testing.replay import (
    MILES_SRC_ENV,
    REQUIRED_KEYS,
    ReplayRefused,
    check_argv,
    main,
    recipe_from_argv,
    resolve_miles_src,
    source_rollouts,
)

SOURCE_ROLLOUTS = 5
K = 2  # the fault rollout
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


def metrics_only(series: SeriesMap) -> SeriesMap:
    return {key: points for key, points in series.items() if key not in STEP_KEYS}


@pytest.fixture(scope="module")
def source_series(source: Path) -> SeriesMap:
    evidence = load_run(source)
    assert evidence.problems == () and evidence.conflicts == ()
    return metrics_only(evidence.series)


def capture_argv(num_rollout: int = SOURCE_ROLLOUTS, **fields: object) -> list[str]:
    return Recipe(num_rollout=num_rollout, capture_metrics=True, **fields).argv()  # type: ignore[arg-type]


@dataclass
class Replayed:
    code: int
    out: str
    err: str


@pytest.fixture
def replay(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., Replayed]:
    """Run ``main`` with the driver's env for ``run_dir``; its stdout becomes ``job.log``."""

    def run(
        run_dir: Path, source: Path, argv: list[str], *options: str, drop: tuple[str, ...] = ()
    ) -> Replayed:
        monkeypatch.setenv("TENSORBOARD_DIR", str(run_dir / "tensorboard"))
        monkeypatch.setenv("MILES_CI_GATE_RECORD_DIR", str(run_dir / "ci_history"))
        for name in drop:
            monkeypatch.delenv(name)
        argv = ["--replay-source", str(source), "--replay-pace", "0", *options, *argv]
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's refusal
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        if code != 2:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "job.log").write_text(out)
        return Replayed(code, out, err)

    return run


def prefix(series: SeriesMap, n: int) -> SeriesMap:
    return {key: points[:n] for key, points in series.items()}


# ---- healthy replays --------------------------------------------------------------------


def test_healthy_replay_writes_the_source_again_in_all_three_formats(
    replay: Callable[..., Replayed], source: Path, source_series: SeriesMap, tmp_path: Path
) -> None:
    """The form of each format is the writer's (``test_miles_writer``); here, the values."""
    done = replay(tmp_path, source, capture_argv())
    assert done.code == 0, done.err
    evidence = load_run(tmp_path)  # TensorBoard, CI history and log merged: no conflict
    assert evidence.problems == () and evidence.conflicts == ()
    assert metrics_only(evidence.series) == source_series
    assert all(evidence.sources[key] == "tensorboard" for key in source_series)
    assert [hit for hit in evidence.sentinels if hit.severity == "fatal"] == []
    ci = read_ci_history_dir(tmp_path / "ci_history")
    assert ci == {key: source_series[key] for key in CI_CAPTURED_KEYS}
    start, *metric_lines = done.out.splitlines()
    assert start.endswith(f"miles_amd replay of {source.name}: 5 rollouts, 0.0 s each "
                          "(imitation writers)")  # fmt: skip
    assert len(metric_lines) == 4 * SOURCE_ROLLOUTS  # perf, rollout, step twice
    assert "TENSORBOARD_DIR" not in done.out and str(tmp_path) not in done.out  # no env value


def test_replay_of_fewer_rollouts_or_without_capture_flags(
    replay: Callable[..., Replayed], source: Path, source_series: SeriesMap, tmp_path: Path
) -> None:
    assert replay(tmp_path / "a", source, capture_argv(num_rollout=3)).code == 0
    evidence = load_run(tmp_path / "a")
    assert evidence.problems == ()
    assert metrics_only(evidence.series) == prefix(source_series, 3)
    assert replay(tmp_path / "b", source, Recipe(num_rollout=2).argv()).code == 0
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["job.log"]
    assert [s for s, _ in load_run(tmp_path / "b").series[ABS_DIFF]] == [0, 1]


# ---- faults, end to end -----------------------------------------------------------------


def test_value_faults_reach_all_three_formats(
    replay: Callable[..., Replayed], source: Path, source_series: SeriesMap, tmp_path: Path
) -> None:
    def run(kind: str) -> tuple[Replayed, SeriesMap, SeriesMap]:
        done = replay(tmp_path / kind, source, capture_argv(), "--replay-fault", kind,
                      "--replay-fault-at", str(K))  # fmt: skip
        assert done.code == 0, done.err
        evidence = load_run(tmp_path / kind)
        assert evidence.problems == () and evidence.conflicts == ()
        return done, evidence.series, read_ci_history_dir(tmp_path / kind / "ci_history")

    _, series, ci = run("spike")
    assert series[ABS_DIFF][K] == ci[ABS_DIFF][K] == (K, SPIKE_VALUE)
    assert [p for p in series[ABS_DIFF] if p[0] != K] == [
        p for p in source_series[ABS_DIFF] if p[0] != K
    ]
    assert series[RAW_REWARD] == source_series[RAW_REWARD]
    done, series, ci = run("nan")
    tensorboard = read_tensorboard_dir(tmp_path / "nan" / "tensorboard")
    assert all(math.isnan(s[ABS_DIFF][K][1]) for s in (series, tensorboard, ci))
    assert f"'{ABS_DIFF}': nan" in done.out
    assert series[ABS_DIFF][K + 1] == source_series[ABS_DIFF][K + 1]
    _, series, _ = run("reward-collapse")
    assert series[RAW_REWARD][:K] == source_series[RAW_REWARD][:K]
    assert [v for _, v in series[RAW_REWARD][K:]] == [0.0] * (SOURCE_ROLLOUTS - K)
    _, series, ci = run("wrong-batch-shape")
    for rewards in (series[RAW_REWARD], ci[RAW_REWARD]):
        values = [v for _, v in rewards]
        assert len(values) == SOURCE_ROLLOUTS
        assert all(abs(v * 64 - round(v * 64)) > 0.3 for v in values), values
        assert all(abs(v * 48 - round(v * 48)) < 1e-5 for v in values), values


def test_run_faults_crash_stop_short_print_sentinels_and_cut_files(
    replay: Callable[..., Replayed],
    source: Path,
    source_series: SeriesMap,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(kind: str) -> Replayed:
        done = replay(tmp_path / kind, source, capture_argv(), "--replay-fault", kind,
                      "--replay-fault-at", str(K))  # fmt: skip
        assert done.code == 0, done.err
        return done

    with pytest.raises(RuntimeError, match="'crash': the trainer died before rollout 2"):
        run("crash")
    (tmp_path / "crash").mkdir(exist_ok=True)
    (tmp_path / "crash" / "job.log").write_text(capsys.readouterr().out)
    evidence = load_run(tmp_path / "crash")  # rollouts 0..K-1 flushed, CI snapshot too
    assert evidence.problems == () and metrics_only(evidence.series) == prefix(source_series, K)
    ci = read_ci_history_dir(tmp_path / "crash" / "ci_history")
    assert [s for s, _ in ci[ABS_DIFF]] == list(range(K))

    done = run("short")
    assert metrics_only(load_run(tmp_path / "short").series) == prefix(source_series, K)
    assert f" - step {K}:" not in done.out and f" - step {K - 1}:" in done.out

    done = run("fatal-sentinel")
    evidence = load_run(tmp_path / "fatal-sentinel")
    (hit,) = [h for h in evidence.sentinels if h.severity == "fatal"]
    assert hit.name == "sglang_lora_skips_moe" and hit.count == 1
    assert f" - perf {K}:" in done.out.splitlines()[hit.first_line]  # right before rollout K
    assert metrics_only(evidence.series) == source_series

    done = run("known-sentinel")
    evidence = load_run(tmp_path / "known-sentinel")
    (hit,) = evidence.sentinels
    assert (hit.name, hit.severity, hit.count) == ("megatron_moe_router_not_fp32", "known", 8)
    pids = re.findall(r"\(MegatronTrainRayActor pid=(\d+)\)\S* .*fp32 routing", done.out)
    assert len(set(pids)) == 8
    assert metrics_only(evidence.series) == source_series

    run("no-tensorboard")
    assert not list((tmp_path / "no-tensorboard").rglob("*tfevents*"))
    assert "tensorboard" not in load_run(tmp_path / "no-tensorboard").sources.values()
    ci = read_ci_history_dir(tmp_path / "no-tensorboard" / "ci_history")
    assert ci[ABS_DIFF] == source_series[ABS_DIFF]

    run("truncated-event")
    tensorboard = tmp_path / "truncated-event" / "tensorboard"
    with pytest.raises(EventFileError):
        read_tensorboard_dir(tensorboard)
    assert [p.source for p in load_run(tmp_path / "truncated-event").problems] == ["tensorboard"]
    event_file = max(tensorboard.iterdir(), key=lambda p: p.stat().st_size)
    with pytest.raises(ValueError, match="no complete final record"):
        final_record_cut(event_file.read_bytes())
    live = read_tensorboard_dir(tensorboard, live=True)  # drops the last scalar only
    assert sum(map(len, live.values())) == SOURCE_ROLLOUTS * len(source_metrics(0)) - 1


# ---- refusals ---------------------------------------------------------------------------


def with_value(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


@pytest.mark.parametrize(
    ("argv", "options", "drop", "named"),
    [
        (capture_argv(SOURCE_ROLLOUTS + 1), (), (), ("--num-rollout 6", "5 rollouts")),
        ([*capture_argv(), "--replay-speed", "2"], (), (), ("--replay-speed",)),
        (capture_argv(), (), ("TENSORBOARD_DIR",), ("TENSORBOARD_DIR",)),
        (capture_argv(), ("--replay-fault", "spike", "--replay-fault-at", "5"), (), ("at 5",)),
        (capture_argv(), ("--replay-fault", "meteor"), (), ("--replay-fault", "meteor")),
        (capture_argv(), ("--replay-writers", "real"), (), (f"DIR or set {MILES_SRC_ENV}",)),
        (Recipe(num_rollout=2).argv(), ("--replay-fault", "no-tensorboard"), (), ("needs",)),
    ],
)
def test_refusals_are_one_line_exit_2_and_write_nothing(
    replay: Callable[..., Replayed],
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    options: tuple[str, ...],
    drop: tuple[str, ...],
    named: tuple[str, ...],
) -> None:
    monkeypatch.delenv(MILES_SRC_ENV, raising=False)
    done = replay(tmp_path / "run", source, argv, *options, drop=drop)
    assert (done.code, done.out) == (2, "")
    (line,) = done.err.splitlines()
    assert line.startswith("replay: refused: ") and all(name in line for name in named), line
    assert str(tmp_path) not in line  # names the variable, never prints a value
    assert not (tmp_path / "run").exists()


def test_refuses_an_untrustworthy_or_missing_source(
    replay: Callable[..., Replayed], source: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    event_file = max((broken / "tensorboard").iterdir(), key=lambda p: p.stat().st_size)
    os.truncate(event_file, final_record_cut(event_file.read_bytes()))
    for where, named in ((broken, "tensorboard"), (tmp_path / "nowhere", "nowhere")):
        done = replay(tmp_path / "run", where, capture_argv())
        assert done.code == 2 and "--replay-source" in done.err and named in done.err
        assert not (tmp_path / "run").exists()


def test_miles_src_for_the_real_writers(tmp_path: Path) -> None:
    def fake_miles(root: Path) -> Path:
        tracking = root / "miles" / "utils" / "tracking_utils" / "tracking.py"
        tracking.parent.mkdir(parents=True)
        tracking.write_text("def log(args, metrics, step_key):\n    pass\n")
        return root

    given, from_env = fake_miles(tmp_path / "given"), fake_miles(tmp_path / "env")
    assert resolve_miles_src(str(given), {MILES_SRC_ENV: str(from_env)}) == given
    assert resolve_miles_src(None, {MILES_SRC_ENV: str(from_env)}) == from_env
    with pytest.raises(ReplayRefused, match="no miles/ package there"):
        resolve_miles_src(str(tmp_path), {})
    relative = "miles/utils/tracking_utils/tracking.py"
    assert source_line(str(given), relative, "def log(") == 1
    with pytest.raises(MilesSourceError, match=r"tracking\.py: no line"):
        source_line(str(given), relative, 'logger.info(f"perf {rollout_id}: {log_dict}")')


# ---- the argv, pure ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "recipe",
    [
        Recipe(),
        Recipe(num_rollout=3, capture_metrics=True),
        Recipe(use_wandb=True, wandb_project="p", wandb_group="g", capture_metrics=True),
        Recipe(model_dir="/data/m", data_dir="rel/data", lr=3e-6, lora_rank=16,
               sglang_max_lora_rank=16, lora_alpha=8, target_modules=("up_proj",)),
        Recipe(num_gpus=4, tensor_model_parallel_size=2, rollout_num_gpus_per_engine=2,
               sglang_mem_fraction_static=0.35, lora_base_cpu_backup=False,
               sglang_lora_use_virtual_experts=True, rollout_batch_size=16, n_samples_per_prompt=4),
        Recipe(hardware=Hardware.MI350X),
    ],
)  # fmt: skip
def test_recipe_from_argv_round_trips(recipe: Recipe) -> None:
    rebuilt = recipe_from_argv(recipe.argv())
    assert rebuilt.argv() == recipe.argv()
    assert check_argv(recipe.argv()) == rebuilt


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda a: with_value(a, "--lr", "1e-5"), "--lr 1e-5: the recipe passes --lr 1e-05"),
        (lambda a: with_value(a, "--num-rollout", "x"), "--num-rollout x: not a valid int"),
        (lambda a: [*a, "--num-rollout", "3"], "--num-rollout: given twice"),
        (lambda a: [*a[: a.index("--lr") + 2], "2", *a[a.index("--lr") + 2 :]], "got 2"),
        (lambda a: ["7", *a], "7: a value before any flag"),
        (lambda a: [*a, "--wandb-key", "SECRET"], "--wandb-key: not a flag"),
        (lambda a: with_value(a, "--global-batch-size", "32"), "batch shape"),
        (lambda a: [t for t in a if t != "--colocate"], "--colocate: missing; the recipe passes"),
        (lambda a: with_value(a, "--lora-rank", "16"), "lora_rank 16 != sglang_max_lora_rank 32"),
        (lambda a: with_value(a, "--optimizer", "sgd"), "the recipe passes --optimizer adam"),
        (lambda a: [*a, "--foo", "1"], "--foo: not a flag of the recipe"),
        (lambda a: a[2:4] + a[:2] + a[4:], "out of the recipe's order"),
    ],
)
def test_check_argv_refuses(change: Callable[[list[str]], list[str]], named: str) -> None:
    with pytest.raises(ReplayRefused) as info:
        check_argv(change(Recipe().argv()))
    assert named in str(info.value) and "SECRET" not in str(info.value)


def test_source_rollouts_requires_complete_series() -> None:
    full: SeriesMap = {key: ((0, 0.1), (1, 0.2)) for key in REQUIRED_KEYS}
    assert source_rollouts("src", {**full, "train/loss": ((0, 1.0),)}) == 2
    for broken, named in (
        ({k: v for k, v in full.items() if k != RAW_REWARD}, RAW_REWARD),
        ({**full, ABS_DIFF: ((0, 0.1), (0, 0.1), (1, 0.2))}, "duplicated or missing"),
        ({**full, "train/loss": ((0, 1.0), (2, 1.0))}, "step 2 where step 1"),
    ):
        with pytest.raises(ReplayRefused, match=named):
            source_rollouts("src", broken)


# ---- the fault catalogue, pure ----------------------------------------------------------

SERIES: SeriesMap = {
    ABS_DIFF: tuple((k, 0.02) for k in range(5)),
    RAW_REWARD: tuple((k, (30 + k) / 64) for k in range(5)),
    "train/loss": tuple((k, 0.5) for k in range(5)),
}


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
    with pytest.raises(FaultError, match=ABS_DIFF):
        transform_series("spike", 0, {RAW_REWARD: SERIES[RAW_REWARD]})


def test_wrong_batch_shape_rewards_are_48ths_never_64ths() -> None:
    for n in range(65):
        value = off_batch_reward(n / 64)
        assert 0 <= value <= 1
        assert (value * 48).is_integer() and not (value * 64).is_integer()
        assert abs(value - n / 64) <= 2 / 48
    assert math.isnan(off_batch_reward(math.nan))
