"""The pictures people read: metrics.png, compare.png and the history trend plot are laid out by
``miles_amd.report.plot``: exactly the panels drawn, one title line, legible text, and a note in
a panel whose series is flat or has no finite value. Checked on the real figures, each drawn
once (the passing example's metrics.png is shared by the tests that read it)."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from miles_amd.baseline.model import Baseline
from miles_amd.evidence.types import JobRecord, RunEvidence
from miles_amd.history.render import trend_figure
from miles_amd.history.store import StoredRun, summarize
from miles_amd.judge.compare import compare
from miles_amd.judge.gate import judge
from miles_amd.report import plot
from miles_amd.report.compare_report import compare_figure
from miles_amd.report.plot import metrics_figure, new_figure, title
from tests.constants import CLIPFRAC, LOGPROB, REWARD


def evidence(values: dict[str, list[float]], run_dir: str = "runs/r") -> RunEvidence:
    series = {metric: tuple(enumerate(vs)) for metric, vs in values.items()}
    return RunEvidence(
        run_dir,
        series,
        dict.fromkeys(series, "tensorboard"),
        job=JobRecord("raysubmit_r", "SUCCEEDED"),
    )


def published(baseline: Baseline, clipfrac: list[float] | None = None) -> dict[str, list[float]]:
    return {
        LOGPROB: list(baseline.series[LOGPROB]),
        REWARD: [round(v * 64) / 64 for v in baseline.series[REWARD]],
        CLIPFRAC: [0.0] * 20 if clipfrac is None else clipfrac,
    }


def notes(ax) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == "note"]


def assert_laid_out(figure, panels: int) -> None:
    """No blank cell, one title line, legible text, every panel drawn on."""
    figure.canvas.draw()
    axes = figure.axes
    assert len(axes) == panels, [ax.get_title() for ax in axes]
    assert all(ax.axison for ax in axes)
    for ax in axes:
        drawn = ax.lines or ax.collections or notes(ax)
        assert drawn, f"empty panel {ax.get_title()!r}"
        assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= plot.TICK_SIZE
        legend = ax.get_legend()
        if legend is not None:
            assert min(t.get_fontsize() for t in legend.get_texts()) >= plot.LEGEND_SIZE
            # under the x label, not over it (a short row's legend once was)
            label = ax.xaxis.label.get_window_extent()
            assert legend.get_window_extent().y1 <= label.y0 + 0.5, (ax.get_title(), label)
    # the cells cover the grid: on two columns an odd last panel spans its row
    cells = sum(len(ax.get_subplotspec().colspan) for ax in axes)
    columns = axes[0].get_subplotspec().get_gridspec().ncols
    assert cells % columns == 0, (cells, columns)
    title = figure.get_suptitle()
    assert title and "\n" not in title
    width = figure._suptitle.get_window_extent().width
    assert width <= figure.bbox.width, (width, figure.bbox.width)


@pytest.fixture(scope="module")
def passing(patched: Baseline):
    """The passing example's metrics.png, drawn and laid out; its run and verdict."""
    run = evidence(published(patched))
    verdict = judge(run, patched)
    figure = metrics_figure(verdict, run, patched)
    assert_laid_out(figure, 3)
    return figure, run, verdict


def test_metrics_png_has_one_title_line_with_the_verdict_once(passing) -> None:
    figure = passing[0]
    title = figure.get_suptitle()
    assert title.startswith("PASS: this run is accepted") and title.count("PASS") == 1
    assert "20 rollouts expected" in title
    assert figure._suptitle.get_fontsize() >= plot.LEGEND_SIZE


def test_a_failing_verdict_with_a_long_sentence_still_fits_one_line(patched: Baseline) -> None:
    values = published(patched)
    values[LOGPROB] = [0.4] * 20  # spikes, mean, max and trend all fail
    values[REWARD] = [0.0] * 20
    run = evidence(values, run_dir="runs/" + "a-long-run-name-" * 6)
    verdict = judge(run, patched)
    figure = metrics_figure(verdict, run, patched)
    assert_laid_out(figure, 3)
    title = figure.get_suptitle()
    assert title.startswith("FAIL: this run is NOT accepted: 7 of 19 checks")
    assert "PASS" not in title
    assert len(title) <= plot.TITLE_LIMIT


def test_a_dollar_in_the_run_name_is_literal_text(patched: Baseline) -> None:
    run = evidence(published(patched), run_dir="runs/$x$")
    figure = new_figure(1, title(judge(run, patched)))
    assert "(run \\$x\\$, 20 rollouts expected)" in figure.get_suptitle()
    figure.canvas.draw()  # mathtext would render "x" alone; a bad one would raise here


def test_flat_and_all_zero_series_carry_a_note(passing) -> None:
    by_title = {ax.get_title(): ax for ax in passing[0].axes}
    assert notes(by_title[CLIPFRAC]) == ["flat: all 20 values are 0"]
    assert notes(by_title[LOGPROB]) == [] and notes(by_title[REWARD]) == []


def test_a_series_without_a_finite_value_carries_a_note(patched: Baseline) -> None:
    run = evidence(published(patched, clipfrac=[math.nan] * 20))
    figure = metrics_figure(judge(run, patched), run, patched)
    (clipfrac,) = [ax for ax in figure.axes if ax.get_title() == CLIPFRAC]
    assert notes(clipfrac) == ["no finite value: all 20 values are NaN or inf"]


@pytest.mark.parametrize("panels", [1, 2, 3, 4, 5])
def test_the_grid_holds_exactly_the_panels(panels: int) -> None:
    figure = plot.new_figure(panels, "title")
    axes = plot.panel_axes(figure, panels)
    assert len(axes) == len(figure.axes) == panels
    cells = sum(len(ax.get_subplotspec().colspan) for ax in axes)
    assert cells == math.ceil(panels / plot.columns_for(panels)) * (plot.columns_for(panels))


@pytest.mark.parametrize(
    ("values", "note"),
    [
        ([0.0, 0.0, 0.0], "flat: all 3 values are 0"),
        ([0.25, math.nan, 0.25], "flat: all 2 finite values are 0.25"),
        ([math.nan, math.inf], "no finite value: all 2 values are NaN or inf"),
        ([0.1, 0.2], None),
        ([0.5], None),
        ([], None),
    ],
)
def test_series_note(values: list[float], note: str | None) -> None:
    assert plot.series_note(values) == note


def test_one_line_folds_newlines_cuts_and_escapes_dollars() -> None:
    assert plot.one_line("a\nb  c $d$") == r"a b c \$d\$"
    hostile = plot.one_line("run\x1b[31m\u202eevil\u200b")
    assert hostile == "run\\x1b[31m\\u202eevil\\u200b"  # shown, not obeyed or dropped
    cut = plot.one_line("x" * 500)
    assert len(cut) == plot.TITLE_LIMIT and cut.endswith("…")


def test_compare_figure_is_laid_out_and_notes_a_flat_metric(patched: Baseline) -> None:
    a = evidence(published(patched), run_dir="runs/a")
    values = published(patched)
    values[REWARD] = [r - 4 / 64 for r in values[REWARD]]
    b = evidence(values, run_dir="runs/b")
    figure = compare_figure(compare(a, b, patched), a, b)
    assert_laid_out(figure, 3)
    by_metric = {ax.get_title().split("\n")[0]: ax for ax in figure.axes}
    assert notes(by_metric[CLIPFRAC]) == ["flat: all 40 values of A and B are 0"]
    assert notes(by_metric[REWARD]) == []


def stored(run_id: int, values: dict[str, list[float]], verdict: str = "pass") -> StoredRun:
    summaries = {m: s for m, vs in values.items() if (s := summarize(vs)) is not None}
    return StoredRun(
        run_id=run_id,
        created_at="",
        recipe="",
        recipe_digest=None,
        variant="patched",
        aiter_commit=None,
        baseline="patched",
        image=None,
        commit_sha=None,
        run_dir=f"runs/{run_id}",
        verdict=verdict,
        reason="",
        rollouts=20,
        failed_checks=(),
        summaries=summaries,
    )


def test_trend_figure_is_laid_out_and_notes_a_flat_metric(patched: Baseline) -> None:
    first = published(patched)
    second = published(patched)
    second[REWARD] = [r + 1 / 64 for r in second[REWARD]]
    figure = trend_figure([stored(1, first), stored(2, second, "fail")], [])
    assert_laid_out(figure, 3)
    by_metric = {ax.get_title(): ax for ax in figure.axes}
    assert notes(by_metric[CLIPFRAC]) == ["flat: all 2 run means are 0"]
    assert notes(by_metric[REWARD]) == []


def test_an_empty_history_is_one_panel_with_a_note() -> None:
    figure = trend_figure([], [])
    assert len(figure.axes) == 1 and notes(figure.axes[0]) == ["no run in the history"]


def savefig_pixels(figure) -> np.ndarray:
    """What ``figure.savefig`` (two draws under constrained layout) paints, as RGBA."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=plot.DPI)
    return np.asarray(Image.open(buffer).convert("RGBA"))


def test_png_bytes_draws_once_what_savefig_paints(patched: Baseline) -> None:
    """The busiest figure: a failing metrics.png (long title, notes, failing marks, legends)."""
    values = published(patched)
    values[LOGPROB] = [0.4] * 20
    failing = evidence(values, run_dir="runs/" + "a-long-run-name-" * 6)
    verdict = judge(failing, patched)
    ours = plot.png_bytes(metrics_figure(verdict, failing, patched))
    pixels = np.asarray(Image.open(io.BytesIO(ours)).convert("RGBA"))
    reference = savefig_pixels(metrics_figure(verdict, failing, patched))
    assert pixels.shape == reference.shape
    assert np.array_equal(pixels, reference), "pixels differ from savefig's"


def test_a_flat_all_zero_panel_takes_a_small_row_last(passing) -> None:
    figure = passing[0]  # clip fraction all 0, as in a healthy run
    panels = [ax for ax in figure.axes if ax.axison]
    assert panels[-1].get_title() == CLIPFRAC
    heights = {ax.get_title(): ax.get_position().height for ax in panels}
    assert heights[CLIPFRAC] < 0.75 * heights[LOGPROB], heights
    assert plot.row_heights(3, [False, False, True]) == [1.0, plot.SMALL_ROW]
    assert plot.row_heights(3, [False, True, False]) == [1.0, 1.0]


def test_a_means_band_is_drawn_where_the_mean_is_beside_the_series(passing) -> None:
    """The band bounds the mean: drawn right of the series with the mean on it, so a passing
    run's points outside it (rollouts 2, 10, 19 of the example) are not 'outside the band'."""
    figure, run, verdict = passing
    (reward,) = [ax for ax in figure.axes if ax.get_title() == REWARD]
    (band,) = [a for a in reward.get_children() if a.get_gid() == "band:raw_reward.mean"]
    last_step = max(s for s, _ in run.series[REWARD])
    band_x = band.get_paths()[0].vertices[:, 0]
    assert band_x.min() > last_step  # beside the series, not across its points
    (check,) = [c for c in verdict.checks if c.name == "raw_reward.mean"]
    (mean,) = [line for line in reward.lines if line.get_label() == "run mean"]
    assert list(mean.get_ydata()) == [check.numbers["value"]]
    assert band_x.min() <= mean.get_xdata()[0] <= band_x.max()
    labels = [t.get_text() for t in reward.texts if t.get_gid() == "band-label:raw_reward.mean"]
    assert labels == ["mean"]


@pytest.mark.parametrize("step", [3, 12])
def test_a_non_finite_value_decided_at_a_look_still_draws(patched: Baseline, step: int) -> None:
    """A NaN decides the trend, spike and clip checks (at the first look after it) without
    the figures the hints draw from: the figure is made all the same (a real CI run crashed
    here, in a hint, with KeyError 'first_step')."""
    values = published(patched)
    values[LOGPROB][step] = math.nan
    values[CLIPFRAC][step] = math.nan
    run = evidence(values)
    verdict = judge(run, patched)
    assert verdict.verdict == "fail"
    assert len(metrics_figure(verdict, run, patched).axes) == 3
