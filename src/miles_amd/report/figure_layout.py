"""The layout every PNG we draw shares: metrics.png, compare.png and the history trend plot.

Decides the grid (exactly the panels drawn: on two columns an odd last panel spans the row,
so no cell is blank; a row of panels a caller calls small, a flat all-zero series, is
:data:`SMALL_ROW` high), the text sizes (legible at the saved size, 90 dpi: nothing below
:data:`LEGEND_SIZE` points), the figure title (one line, literal text: newlines folded,
``$`` not read as mathtext, control and format characters escaped, cut at
:data:`TITLE_LIMIT` characters, its font made smaller down to :data:`LEGEND_SIZE` when the
line is wider than the figure), each panel's legend
(under its panel, so the data keep the width) and the note a panel carries when its series
cannot be read as a line (flat, or no finite value). It does not decide what a panel shows:
its callers draw the data. matplotlib objects are passed in; nothing here imports it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from miles_amd.escape import terminal

DPI = 90
PANEL_WIDTH_IN = 6.5
PANEL_HEIGHT_IN = 3.4
TITLE_SIZE = 12
PANEL_TITLE_SIZE = 10
LABEL_SIZE = 9
TICK_SIZE = 9
LEGEND_SIZE = 8
NOTE_SIZE = 10
TITLE_LIMIT = 200
LEGEND_DROP = 2.2 * TICK_SIZE + 1.5 * LABEL_SIZE  # points: the tick labels and the x label
SMALL_ROW = 0.55  # a row of flat all-zero panels, in panel heights (room for its legend)


def columns_for(panels: int) -> int:
    """Two columns from two panels on, one for a single panel."""
    return 2 if panels > 1 else 1


def row_heights(panels: int, small: Sequence[bool] = ()) -> list[float]:
    """Each grid row's height in panel heights: :data:`SMALL_ROW` for a row whose panels are
    all ``small`` (a flat all-zero series says all it has in a strip), else 1."""
    count = max(1, panels)
    columns = columns_for(count)
    flags = list(small) + [False] * (count - len(small))
    return [
        SMALL_ROW if all(flags[row * columns : (row + 1) * columns]) else 1.0
        for row in range(math.ceil(count / columns))
    ]


def new_figure(panels: int, title: str, colour: str = "black", small: Sequence[bool] = ()) -> Any:
    """A figure on the Agg canvas sized for ``panels`` (at least one), titled in one line;
    ``small``: which panels take a small row (:func:`row_heights`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = columns_for(panels)
    size = (PANEL_WIDTH_IN * columns, PANEL_HEIGHT_IN * sum(row_heights(panels, small)) + 0.5)
    figure = Figure(figsize=size, dpi=DPI, layout="constrained")
    canvas = FigureCanvasAgg(figure)
    text = figure.suptitle(one_line(title), fontsize=TITLE_SIZE, color=colour)
    room = 0.98 * size[0] * figure.dpi
    width = text.get_window_extent(canvas.get_renderer()).width
    if width > room:  # a long sentence: a smaller font, never below the legend's
        text.set_fontsize(max(LEGEND_SIZE, TITLE_SIZE * room / width))
    return figure


def panel_axes(figure: Any, panels: int, small: Sequence[bool] = ()) -> list[Any]:
    """``panels`` axes filling the grid (one axes, the whole figure, for zero panels); rows
    of ``small`` panels are short (:func:`row_heights`)."""
    count = max(1, panels)
    columns = columns_for(count)
    heights = row_heights(count, small)
    grid = figure.add_gridspec(len(heights), columns, height_ratios=heights)
    axes = []
    for index in range(count):
        row, column = divmod(index, columns)
        last_alone = index == count - 1 and column == 0 and columns > 1
        axes.append(figure.add_subplot(grid[row, :] if last_alone else grid[row, column]))
    return axes


def one_line(text: str, limit: int = TITLE_LIMIT) -> str:
    """``text`` as one literal line of at most ``limit`` characters, control and format
    characters shown as their escapes (``miles_amd.escape.terminal``: a run dir's name is
    foreign text)."""
    flat = terminal(" ".join(text.split()))
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return flat.replace("$", r"\$")


def literal_lines(text: str) -> str:
    """``text``'s own lines, each shown literally: escaped (``miles_amd.escape.terminal``), no
    mathtext."""
    return "\n".join(terminal(line).replace("$", r"\$") for line in text.split("\n"))


def style_panel(ax: Any, title: str, xlabel: str, ylabel: str, title_colour: str) -> None:
    """Title, axis labels, integer x ticks, tick sizes and a light grid."""
    from matplotlib.ticker import MaxNLocator

    ax.set_title(literal_lines(title), fontsize=PANEL_TITLE_SIZE, color=title_colour)
    ax.set_xlabel(xlabel, fontsize=LABEL_SIZE)
    ax.set_ylabel(ylabel, fontsize=LABEL_SIZE)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(labelsize=TICK_SIZE)
    ax.yaxis.get_offset_text().set_fontsize(TICK_SIZE)
    ax.grid(True, color="0.9", linewidth=0.5)


def legend_below(ax: Any) -> None:
    """The panel's legend under its x label, two columns, when the panel has labelled lines:
    :data:`LEGEND_DROP` points below the axes whatever their height (a fraction of the axes
    put a short row's legend over its x label)."""
    from matplotlib.transforms import offset_copy

    if ax.get_legend_handles_labels()[0]:
        ax.legend(
            fontsize=LEGEND_SIZE,
            loc="upper center",
            bbox_to_anchor=(0.5, 0.0),
            bbox_transform=offset_copy(ax.transAxes, fig=ax.figure, y=-LEGEND_DROP, units="points"),
            ncols=2,
            frameon=False,
        )


def series_note(values: Sequence[float], noun: str = "values") -> str | None:
    """Why a panel's ``values`` do not read as a line: flat, or none finite; None when they do."""
    finite = [v for v in values if math.isfinite(v)]
    if values and not finite:
        return f"no finite value: all {len(values)} {noun} are NaN or inf"
    if len(finite) > 1 and min(finite) == max(finite):
        which = noun if len(finite) == len(values) else f"finite {noun}"
        return f"flat: all {len(finite)} {which} are {finite[0]:.6g}"
    return None


def draw_note(ax: Any, text: str) -> None:
    """``text`` boxed in the middle of the panel, above the data (gid ``note``)."""
    ax.text(
        0.5,
        0.5,
        literal_lines(text),
        transform=ax.transAxes,
        ha="center",
        va="center",
        fontsize=NOTE_SIZE,
        zorder=10,
        bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.6", "alpha": 0.9},
        gid="note",
    )


def png_bytes(figure: Any) -> bytes:
    """The figure (made by :func:`new_figure`, so at :data:`DPI`) as PNG bytes.

    Drawn once and the canvas's pixels encoded: ``savefig`` would draw twice under a layout
    engine (a layout pass, then the image). The pixels are ``savefig``'s (checked by a test).
    """
    import io

    import numpy as np
    from matplotlib.image import imsave

    figure.canvas.draw()
    buffer = io.BytesIO()
    imsave(buffer, np.asarray(figure.canvas.buffer_rgba()), format="png", dpi=DPI)
    return buffer.getvalue()
