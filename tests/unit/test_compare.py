"""`miles-amd compare`: the paired statistics by hand, and the command on real run dirs."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.compare import (
    compare,
    fisher_fewer,
    holm,
    rate_ruled_out,
    rollouts_for_power,
    spike_power,
    t_quantile,
    t_two_sided_p,
)
from miles_amd.rules.model import Baseline
from tests.cli_runs import flat, run_cli
from tests.constants import CLIPFRAC, EXAMPLE, LOGPROB, REWARD
from tests.run_dirs import published_values, write_run


@pytest.fixture(scope="module")
def patched() -> Baseline:
    return load_baseline("patched")


@pytest.fixture(scope="module")
def worse_run(tmp_path_factory, patched: Baseline) -> Path:
    """A run 'stock': logprob gap +30%, two spikes, reward 4/64 lower at every rollout."""
    values = published_values()
    values[LOGPROB] = [v * 1.3 for v in values[LOGPROB]]
    values[LOGPROB][4], values[LOGPROB][13] = 0.31, 0.2
    values[REWARD] = [r - 4 / 64 for r in values[REWARD]]
    return write_run(tmp_path_factory.mktemp("cmp") / "stock", values)


def test_statistics_by_hand() -> None:
    assert t_quantile(0.975, 19) == pytest.approx(2.093, abs=0.002)
    assert t_quantile(0.975, 5) == pytest.approx(2.571, abs=0.01)
    assert t_quantile(0.975, 1) == 12.706
    # one-sided: B has b spikes or fewer of the a + b; 5 of 5 in A, 0 of 5 in B: 1/C(10,5)
    assert fisher_fewer(5, 5, 0, 5) == pytest.approx(1 / 252)
    assert fisher_fewer(0, 5, 5, 5) == 1.0
    assert fisher_fewer(2, 20, 0, 20) == pytest.approx(190 / 780)
    assert t_two_sided_p(2.093, 19) == pytest.approx(0.05, abs=1e-3)
    assert t_two_sided_p(0.0, 7) == 1.0
    assert rate_ruled_out(20) == pytest.approx(0.139, abs=0.001)  # about 3/N
    assert rate_ruled_out(300) == pytest.approx(3 / 300, rel=0.01)
    # Holm: sorted 0.01, 0.03, 0.04 -> 3 x 0.01, 2 x 0.03, max(0.06, 1 x 0.04)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    # 20 vs 20 rollouts cannot show a 10% spike rate gone; the rollouts for 95% power can
    assert spike_power(0.10, 20, 20) < 0.10
    needed = rollouts_for_power(0.10)
    assert needed is not None and 60 < needed < 120
    assert spike_power(0.10, needed, needed) >= 0.95 > spike_power(0.10, needed - 1, needed - 1)
    assert spike_power(0.05, needed, needed) < 0.95  # a rarer spike needs more rollouts
    # A at rate 1 spikes every rollout, B never: p = 1/C(2n, n) <= 5% from n = 3
    assert spike_power(1.0, 3, 3) == 1.0 and spike_power(1.0, 2, 2) == 0.0


def test_a_run_against_itself_shows_no_difference(patched: Baseline) -> None:
    run = load_run(EXAMPLE)
    result = compare(run, run, patched)
    by_metric = {d.metric: d for d in result.diffs}
    assert set(by_metric) == {LOGPROB, REWARD, CLIPFRAC}
    for d in result.diffs:
        assert d.diff == 0 and not d.significant and d.n == 20
    # identical rewards: the SE is the binomial floor, so the CI is not a point
    assert by_metric[REWARD].binomial_floor and by_metric[REWARD].ci_high > 0.03
    assert result.spikes[0].count_a == result.spikes[0].count_b == 0
    assert result.spikes[0].p_value == 1.0
    assert "train/train_rollout_kl" in result.unpaired


def test_a_worse_run_differs_and_its_spikes_are_counted_not_paired(
    worse_run: Path, patched: Baseline
) -> None:
    result = compare(load_run(worse_run), load_run(EXAMPLE), patched)
    by_metric = {d.metric: d for d in result.diffs}
    logprob = by_metric[LOGPROB]
    assert logprob.n == 18 and 4 not in logprob.steps and 13 not in logprob.steps
    assert logprob.significant and logprob.relative == pytest.approx(-0.3 / 1.3, rel=0.01)
    assert by_metric[REWARD].diff == pytest.approx(4 / 64)
    assert by_metric[REWARD].significant
    (spikes,) = result.spikes
    assert (spikes.count_a, spikes.count_b) == (2, 0)
    assert spikes.p_value == pytest.approx(190 / 780)  # one-sided: B spikes less than A


def test_compare_cli_on_real_run_dirs(worse_run: Path, tmp_path: Path) -> None:
    """B's dir name is undecodable bytes (surrogate escapes), which once crashed the figure's
    legend: it is drawn escaped."""
    b = Path(os.fsdecode(bytes(tmp_path) + b"/run-\xff\xfe"))
    shutil.copytree(EXAMPLE, b, ignore=shutil.ignore_patterns("report"))
    out = b / "report" / "compare"  # the default out dir: B's report
    result = run_cli("compare", "--run-dir", str(worse_run), "--run-dir", str(b))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    text = flat(result.stdout)  # the lines are wrapped at 100 columns
    assert text.startswith("miles-amd compare: B ") and f"vs A {worse_run}" in text
    assert "could detect a shift of" in text
    assert "A 2/20, B 0/20 rollouts (one-sided Fisher's exact p = 0.244" in text
    assert "the data cannot decide whether B spikes less often than A" in text
    assert lines[-1].endswith("compare.md (also compare.json, compare.png)")
    report = json.loads((out / "compare.json").read_text())
    assert {m["metric"] for m in report["metrics"]} == {LOGPROB, REWARD, CLIPFRAC}
    assert report["spikes"][0]["a"] == [2, 20] and math.isfinite(report["metrics"][0]["se"])
    assert (out / "compare.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "compare.md").read_text().startswith("**miles-amd compare** - B differs")


def no_metrics(tmp_path: Path) -> list[str]:
    empty = tmp_path / "empty"
    (empty / "tensorboard").mkdir(parents=True)
    return ["--run-dir", str(EXAMPLE), "--run-dir", str(empty)]


def linked_log(tmp_path: Path) -> list[str]:
    """A job.log linked out of the run dir is refused unread (as the gate refuses it)."""
    linked = tmp_path / "linked"
    shutil.copytree(EXAMPLE, linked, ignore=shutil.ignore_patterns("report", "tensorboard"))
    shutil.rmtree(linked / "ci_history")
    (linked / "job.log").rename(tmp_path / "elsewhere.log")
    (linked / "job.log").symlink_to(tmp_path / "elsewhere.log")
    return ["--run-dir", str(EXAMPLE), "--run-dir", str(linked)]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--run-dir", str(EXAMPLE)], ["--run-dir: given 1 time(s); give it exactly twice"]),
        (
            ["--run-dir", str(EXAMPLE), "--run-dir", "/nonexistent/run"],
            ["--run-dir /nonexistent/run: no such directory"],
        ),
        (
            ["--run-dir", str(EXAMPLE), "--run-dir", str(EXAMPLE), "--baseline", "nope"],
            ["--baseline nope: no such baseline file"],
        ),
        (no_metrics, ["empty: no metric read"]),
        (linked_log, ["linked", "job.log", "symbolic link"]),
    ],
)
def test_compare_bad_input_is_one_line_exit_2(args, said: list[str], tmp_path: Path) -> None:
    args = args(tmp_path) if callable(args) else args
    result = run_cli("compare", *args, "--out-dir", str(tmp_path / "out"))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("miles-amd: error: --"), line
    assert all(part in line for part in said), line
    assert not (tmp_path / "out").exists()


def corrupt_record(run_dir: Path) -> str:
    """A truncated last line in the largest CI-history record: a source problem."""
    record = max((run_dir / "ci_history").iterdir(), key=lambda p: p.stat().st_size)
    record.write_text(record.read_text() + '{"metric": "train/grad_norm", "series": [[0, \n')
    return "evidence.readable"


def disagreeing_log(run_dir: Path) -> str:
    """job.log says another logprob gap than TensorBoard at step 0: a conflict."""
    log = (run_dir / "job.log").read_text()
    before = "'train/train_rollout_logprob_abs_diff': 0.0208,"
    assert before in log
    (run_dir / "job.log").write_text(log.replace(before, f"'{LOGPROB}': 0.0999,"))
    return "evidence.consistent"


@pytest.mark.parametrize("spoil", [corrupt_record, disagreeing_log])
@pytest.mark.parametrize("which", ["A", "B"])
def test_a_run_the_gate_fails_as_evidence_is_not_compared(
    tmp_path: Path, spoil, which: str
) -> None:
    """The gate fails such a run (exit 1) by its evidence checks; compare said nothing and
    compared it. Now exit 1, one line naming the run dir and the check, nothing written."""
    bad = tmp_path / "bad"
    shutil.copytree(EXAMPLE, bad, ignore=shutil.ignore_patterns("report"))
    check = spoil(bad)
    pair = [str(EXAMPLE), str(bad)] if which == "B" else [str(bad), str(EXAMPLE)]
    out = tmp_path / "out"
    done = run_cli("compare", "--run-dir", pair[0], "--run-dir", pair[1], "--out-dir", str(out))
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"miles-amd: error: --run-dir {bad}: {check} fails"), line
    assert not out.exists() and not (bad / "report").exists()


def test_a_a_comparisons_call_a_difference_rarely_with_holm() -> None:
    """Healthy pairs of simulated runs on one prompt sequence: Holm keeps the
    family-wise rate near 5%; without it a 'difference' shows up far more often."""
    import numpy as np

    from tests.support import honest, simulate

    patched, stock = load_baseline("patched"), load_baseline("stock")
    model = honest.honest_model(patched, stock, honest.Noise(0.0, 0.0, 0.0, 0.0))
    rng = np.random.default_rng(5)
    any_raw = any_holm = 0
    pairs = 150
    for _ in range(pairs):
        runs = model.runs(model.prompts(rng, 20), 2, "patched", rng)
        result = compare(simulate.evidence(runs, 0), simulate.evidence(runs, 1), patched)
        any_raw += any(d.p_value <= 0.05 for d in result.diffs)
        any_holm += any(d.significant for d in result.diffs)
    assert any_holm / pairs <= 0.09
    assert any_raw > any_holm


def test_a_run_compared_with_itself_its_copy_or_a_shorter_run_is_warned_about(
    patched: Baseline, tmp_path: Path
) -> None:
    from miles_amd.report.compare_report import render_markdown, render_text, to_json

    same = compare(load_run(EXAMPLE), load_run(EXAMPLE), patched)
    assert f"WARNING: A and B are the same run dir ({EXAMPLE}): every difference is 0" in flat(
        render_text(same).split("\n\n")[0]
    )
    assert "> **Warning**: A and B are the same run dir" in render_markdown(same)
    copy = tmp_path / "copy"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("report"))
    assert compare(load_run(EXAMPLE), load_run(copy), patched).warnings == (
        "A and B hold the same run (job jvvnhop9, the same series): every difference is 0 by "
        "construction; pass the other arm's run dir",
    )
    values = published_values()
    longer = write_run(tmp_path / "twenty", values)
    shorter = write_run(tmp_path / "ten", {k: v[:10] for k, v in values.items()}, job_id="b")
    result = compare(load_run(longer), load_run(shorter), patched)
    assert result.warnings == (
        "A has 20 rollouts and B 10: paired on the rollouts both logged (10 at most); the rest "
        "of the longer run is not compared",
    )
    assert {d.n for d in result.diffs} == {10}
    assert to_json(result)["warnings"] == list(result.warnings)


def test_a_difference_below_the_datas_precision_is_shown_as_zero(patched: Baseline) -> None:
    from dataclasses import replace

    from miles_amd.report.compare_report import at_precision, diff_sentence

    (d,) = [
        d
        for d in compare(load_run(EXAMPLE), load_run(EXAMPLE), patched).diffs
        if d.metric == LOGPROB
    ]
    rounding = replace(d, diff=-9e-11, ci_low=-2e-10, ci_high=1.8e-10)
    assert at_precision(rounding.diff, rounding) == "0"
    assert diff_sentence(rounding).startswith("Δ = 0, 95% CI [0, 0]")
    real = replace(d, diff=-0.0009, ci_low=-0.0012, ci_high=-0.0006)
    assert diff_sentence(real).startswith("Δ = -0.0009 (")
