"""What a reader needs from any figure, as checks on a drawn matplotlib Figure.

* :func:`small_texts`: every visible text (titles, labels, tick labels, legend entries,
  annotations) is at least ``min_pt`` points at the figure's own size;
* :func:`too_small_when_shown`: ... and at least 9 pt at the size the book shows it;
* :func:`overlapping`: pairs of rectangles (in display pixels) that intersect;
* :func:`extent`: where an artist lands on the canvas after layout.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.transforms import Bbox


def drawn(fig: Figure) -> Figure:
    """Draw ``fig`` on an Agg canvas (attached if it has none) so that layout, extents and tick
    labels are final, as in the saved PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig


def _shown(t: Text) -> bool:
    if not t.get_visible() or not t.get_text().strip():
        return False
    ax = t.axes
    return ax is None or ax.get_visible()


def small_texts(fig: Figure, min_pt: float = 8.0) -> list[tuple[str, float]]:
    """``(text, size)`` of every shown text smaller than ``min_pt`` points."""
    drawn(fig)
    return [(t.get_text(), t.get_fontsize()) for t in fig.findobj(Text) if _shown(t) and t.get_fontsize() < min_pt]


def extent(artist, fig: Figure) -> Bbox:
    """The artist's bounding box in display pixels, after layout."""
    drawn(fig)
    return artist.get_window_extent(fig.canvas.get_renderer())


def overlapping(boxes: list[Bbox], pad: float = 0.0) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, of boxes that intersect by more than ``pad`` pixels."""
    out = []
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            a, b = boxes[i], boxes[j]
            dx = min(a.x1, b.x1) - max(a.x0, b.x0)
            dy = min(a.y1, b.y1) - max(a.y0, b.y0)
            if dx > pad and dy > pad:
                out.append((i, j))
    return out


def inside(inner: Bbox, outer: Bbox, tol: float = 0.5) -> bool:
    """Whether ``inner`` lies within ``outer`` (to ``tol`` pixels)."""
    return (inner.x0 >= outer.x0 - tol and inner.y0 >= outer.y0 - tol
            and inner.x1 <= outer.x1 + tol and inner.y1 <= outer.y1 + tol)


def saved_width_in(fig: Figure) -> float:
    """Width in inches of the PNG that ``save_figure`` writes (``bbox_inches="tight"``, padded
    by ``savefig.pad_inches``), which the book stretches to the text column."""
    import matplotlib as mpl

    drawn(fig)
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    return box.width + 2 * float(mpl.rcParams["savefig.pad_inches"])


def displayed_sizes(fig: Figure) -> list[tuple[str, float]]:
    """``(text, points)`` of every shown text at the size a reader sees it: the book shows each
    figure at the column width (:data:`companion.figures.palette.DISPLAY_WIDTH_IN`), so a font
    of ``s`` points in a figure ``w`` inches wide reads as ``s * column / w`` points."""
    from companion.figures.palette import displayed_scale

    scale = displayed_scale(saved_width_in(fig))
    return [(t.get_text(), t.get_fontsize() * scale) for t in fig.findobj(Text) if _shown(t)]


def too_small_when_shown(fig: Figure, min_pt: float | None = None) -> list[tuple[str, float]]:
    """Shown texts under ``min_pt`` points (default :data:`~companion.figures.palette.MIN_DISPLAY_PT`)
    at the displayed size."""
    from companion.figures.palette import MIN_DISPLAY_PT

    floor = MIN_DISPLAY_PT if min_pt is None else min_pt
    return [(s, round(pt, 2)) for s, pt in displayed_sizes(fig) if pt < floor]


def assert_panels_clear(name: str, fig: Figure, *, figure_legends: bool = False) -> None:
    """No panel (ticks, labels, title) runs into another (or, with ``figure_legends``, into a figure
    legend), every one lies inside the figure, and text written on a panel stays clear of its legend."""
    drawn(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]
    if figure_legends:
        boxes += [leg.get_window_extent(renderer) for leg in fig.legends]
    assert not overlapping(boxes, pad=1.0), name
    assert all(inside(b, fig.bbox, tol=2.0) for b in boxes), name
    for ax in fig.axes:
        legend = ax.get_legend()
        notes = [t.get_window_extent(renderer) for t in ax.texts if t.get_visible() and t.get_text().strip()]
        if legend is not None and notes:
            assert not [ij for ij in overlapping([legend.get_window_extent(renderer)] + notes) if ij[0] == 0], \
                (name, [t.get_text() for t in ax.texts])
