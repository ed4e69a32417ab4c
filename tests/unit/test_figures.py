"""The pictures people read (``miles_amd.report.plot``): metrics.png, compare.png and the
history trend plot are drawn, readable (one title line, legible text, one panel a metric), and
a panel whose series is flat or has no finite value says so."""

from __future__ import annotations

import io
import math
from dataclasses import replace

import pytest
from PIL import Image

from miles_amd.baseline.model import Baseline
from miles_amd.evidence.types import JobRecord, RunEvidence
from miles_amd.history.drift import Drift
from miles_amd.history.store import StoredRun, summarize
from miles_amd.judge.compare import compare
from miles_amd.judge.gate import judge
from miles_amd.report import plot
from tests.constants import CLIPFRAC, KL, LOGPROB, REWARD


def evidence(values: dict[str, list[float]], run_dir: str = "runs/r") -> RunEvidence:
    series = {metric: tuple(enumerate(vs)) for metric, vs in values.items()}
    job = JobRecord("raysubmit_r", "SUCCEEDED")
    return RunEvidence(run_dir, series, dict.fromkeys(series, "tensorboard"), job=job)


def published(baseline: Baseline, clipfrac: list[float] | None = None) -> dict[str, list[float]]:
    return {
        LOGPROB: list(baseline.series[LOGPROB]),
        REWARD: [round(v * 64) / 64 for v in baseline.series[REWARD]],
        CLIPFRAC: [0.0] * 20 if clipfrac is None else clipfrac,
    }


def notes(figure) -> dict[str, list[str]]:
    """Each panel's notes, by the first line of its title."""
    return {
        ax.get_title().split("\n")[0]: [t.get_text() for t in ax.texts if t.get_gid() == "note"]
        for ax in figure.axes
    }


def assert_readable(figure, panels: int) -> None:
    """Drawn to a PNG; one panel a metric, one title line that fits, legible text."""
    image = Image.open(io.BytesIO(plot.png_bytes(figure)))
    assert image.format == "PNG" and image.size == (figure.bbox.width, figure.bbox.height)
    assert len(figure.axes) == panels
    title = figure.get_suptitle()
    assert title and "\n" not in title and len(title) <= plot.TITLE_LIMIT
    assert figure._suptitle.get_window_extent().width <= figure.bbox.width
    for ax in figure.axes:
        assert ax.lines or ax.collections or ax.texts, f"empty panel {ax.get_title()!r}"
        assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= plot.TICK_SIZE


def stored(run_id: int, values: dict[str, list[float]], verdict: str = "pass") -> StoredRun:
    summaries = {m: s for m, vs in values.items() if (s := summarize(vs)) is not None}
    return StoredRun(
        run_id=run_id, created_at="", recipe="", recipe_digest=None, variant="patched",
        aiter_commit=None, baseline="patched", image=None, commit_sha=None,
        run_dir=f"runs/{run_id}", verdict=verdict, reason="", rollouts=20, failed_checks=(),
        summaries=summaries,
    )  # fmt: skip


def test_each_figure_is_drawn_readable_and_notes_a_flat_or_non_finite_series(
    patched: Baseline,
) -> None:
    passing = evidence(published(patched))
    figure = plot.metrics_figure(judge(passing, patched), passing, patched)
    assert_readable(figure, 3)
    assert figure.get_suptitle().startswith("PASS: this run is accepted")
    assert notes(figure) == {LOGPROB: [], REWARD: [], CLIPFRAC: ["flat: all 20 values are 0"]}

    values = published(patched, clipfrac=[math.nan] * 20)
    values[LOGPROB] = [0.4] * 20  # spikes, mean, max and trend all fail: a long title
    failing = evidence(values, run_dir="runs/" + "a-long-run-name-" * 6)
    figure = plot.metrics_figure(judge(failing, patched), failing, patched)
    assert_readable(figure, 3)
    assert figure.get_suptitle().startswith("FAIL: this run is NOT accepted")
    assert plot.one_line("run\n $x$\x1b") == "run \\$x\\$\\x1b"  # literal: no mathtext
    assert notes(figure)[CLIPFRAC] == ["no finite value: all 20 values are NaN or inf"]

    b_values = published(patched)
    b_values[REWARD] = [r - 4 / 64 for r in b_values[REWARD]]
    a, b = evidence(published(patched), "runs/a"), evidence(b_values, "runs/b")
    figure = plot.compare_figure(compare(a, b, patched), a, b)
    assert_readable(figure, 3)
    assert notes(figure)[CLIPFRAC] == ["flat: all 40 values of A and B are 0"]

    figure = plot.trend_figure([stored(1, published(patched)), stored(2, b_values, "fail")], [])
    assert_readable(figure, 3)
    assert notes(figure)[CLIPFRAC] == ["flat: all 2 run means are 0"]
    assert notes(plot.trend_figure([], []))[""] == ["no run in the history"]


def test_a_means_band_is_drawn_beside_the_series_with_the_mean_on_it(patched: Baseline) -> None:
    """The band bounds the mean, not the points: drawn right of the series."""
    run = evidence(published(patched))
    verdict = judge(run, patched)
    (reward,) = [ax for ax in plot.metrics_figure(verdict, run, patched).axes
                 if ax.get_title() == REWARD]  # fmt: skip
    (band,) = [a for a in reward.get_children() if a.get_gid() == "band:raw_reward.mean"]
    band_x = band.get_paths()[0].vertices[:, 0]
    assert band_x.min() > max(s for s, _ in run.series[REWARD])
    (check,) = [c for c in verdict.checks if c.name == "raw_reward.mean"]
    (mean,) = [line for line in reward.lines if line.get_label() == "run mean"]
    assert list(mean.get_ydata()) == [check.numbers["value"]]


@pytest.mark.parametrize(
    ("values", "note"),
    [
        ([0.0, 0.0, 0.0], "flat: all 3 values are 0"),
        ([0.25, math.nan, 0.25], "flat: all 2 finite values are 0.25"),
        ([math.nan, math.inf], "no finite value: all 2 values are NaN or inf"),
        ([0.1, 0.2], None),
        ([], None),
    ],
)
def test_series_note(values: list[float], note: str | None) -> None:
    assert plot.series_note(values) == note


@pytest.mark.parametrize("step", [3, 12])
def test_a_non_finite_value_decided_at_a_look_still_draws(patched: Baseline, step: int) -> None:
    """A NaN decides checks without the figures their hints draw from (a CI run once crashed
    in a hint with KeyError 'first_step')."""
    values = published(patched)
    values[LOGPROB][step] = math.nan
    values[CLIPFRAC][step] = math.nan
    run = evidence(values)
    verdict = judge(run, patched)
    assert verdict.verdict == "fail"
    assert len(plot.metrics_figure(verdict, run, patched).axes) == 3


def panel(figure, metric: str):
    (ax,) = [ax for ax in figure.axes if ax.get_title() == metric]
    return ax


def test_metrics_png_draws_each_rules_hint_and_the_failing_points(patched: Baseline) -> None:
    values = published(patched)
    values[LOGPROB][6] = 0.42  # a spike
    values[REWARD][9] = math.nan
    run = evidence(values)
    figure = plot.metrics_figure(judge(run, patched), run, patched)
    logprob = panel(figure, LOGPROB)
    gids = {artist.get_gid() for artist in logprob.get_children()}
    assert {"threshold", "max", "band:logprob_abs_diff.mean", "failing"} <= gids
    (threshold,) = [line for line in logprob.lines if line.get_gid() == "threshold"]
    assert list(threshold.get_ydata()) == [0.15, 0.15]
    (crosses,) = [line for line in logprob.lines if line.get_gid() == "failing"]
    assert list(crosses.get_xdata()) == [6] and list(crosses.get_ydata()) == [0.42]
    reward = panel(figure, REWARD)
    labels = [t.get_text() for t in reward.texts if not str(t.get_gid()).startswith("band-")]
    assert labels == ["nan"]  # the non-finite point, labelled
    assert "baseline jvvnhop9 (published)" in reward.get_legend_handles_labels()[1]
    # no empty panel for an unmeasured metric: one footer line names them
    assert [ax.get_title() for ax in figure.axes] == [LOGPROB, REWARD, CLIPFRAC]
    assert "train/train_rollout_kl" in figure._supxlabel.get_text()

    run = evidence(published(patched))  # a far threshold is named in the legend, not drawn
    figure = plot.metrics_figure(judge(run, patched), run, patched)
    logprob = panel(figure, LOGPROB)
    assert logprob.get_ylim()[1] < 0.05
    (note,) = [line for line in logprob.lines if line.get_gid() == "threshold"]
    assert note.get_label() == "spike threshold 0.15: off scale, 7.2x this run's max"
    for ax in figure.axes:
        assert not [line for line in ax.lines if line.get_gid() == "failing"]
        assert ax.title.get_color() == "black"

    values = published(patched)
    values[KL] = [1.8e-3] * 20  # about twice the published level
    run = evidence(values)
    kl = panel(plot.metrics_figure(judge(run, patched), run, patched), KL)
    assert [a for a in kl.get_children() if a.get_gid() == "band:train_rollout_kl.mean"]
    labels = kl.get_legend_handles_labels()[1]
    assert "band for the geometric mean (train_rollout_kl.mean)" in labels
    assert "run geometric mean" in labels


def test_stored_figures_at_the_edge_of_the_float_range_are_drawn() -> None:
    """Summaries another tool wrote at ±1.7e308 (sd 1e308) are drawn within the axis range,
    and a drifting metric's title is red."""
    runs = []
    for i, mean in enumerate((1.7e308, -1.7e308, 1.7e308), start=1):
        run = stored(i, {LOGPROB: [0.017, 0.018]})
        edge = replace(run.summaries[LOGPROB], mean=mean, sd=1e308)
        runs.append(replace(run, summaries={LOGPROB: edge}))
    drift = Drift(LOGPROB, "up", 66, 54, (0.0, 1.0), (1, 3))
    figure = plot.trend_figure(runs, [drift])
    assert plot.png_bytes(figure).startswith(b"\x89PNG")
    assert panel(figure, f"{LOGPROB}  (drift)").title.get_color() == "tab:red"
