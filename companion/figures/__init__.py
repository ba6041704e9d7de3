"""Figure code shared by the notebooks, and the one switch that writes figures to disk.

``save_figure(fig, name)`` writes ``<dir>/<name>.png`` and ``<dir>/<name>.pdf`` when a figure
directory is set (``COMPANION_FIGURES_DIR`` in the environment, which ``companion reproduce`` sets,
or the ``directory`` argument); otherwise it does nothing, so notebooks run read-only by default.
Names are stable so that the reproduction-status page can list what produced each figure.
Inside a notebook kernel, a saved figure also leaves an invisible marker in the cell's output
(:data:`FIGURE_MARKER`); when the book is built, the marker becomes the figure's PNG and PDF
download links, placed under the figure.
"""
from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Iterator

FIGURES_ENV = "COMPANION_FIGURES_DIR"
FIGURE_MARKER = re.compile(r"^<!-- companion-figure: ([a-z0-9][a-z0-9_\-]*) -->$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")

PNG_DPI = 150.0
"""Resolution of every saved PNG."""

PHONE_SUFFIX = ".phone"
"""A figure's phone variant is ``<name>.phone.png`` (a dot: no figure name holds one)."""

PHONE_COLUMN_PX = 342
"""Width (CSS px) at which the book shows a figure on a phone 390 px wide (measured in Chromium)."""

PHONE_BREAKPOINT_PX = 720
"""Below this window width (CSS px) the book serves a figure's phone variant, where it has one
(``book/_ext/companion_figures.py``); the stylesheet's narrow-screen rules start there too."""

PHONE_MIN_PX = 9.0
"""Smallest text height (CSS px, the font's size) a figure may show on a phone."""

PHONE_TARGET_PX = 9.5
"""What a phone variant aims at, a little over :data:`PHONE_MIN_PX`."""

PHONE_NARROWEST_IN = 3.0
"""A phone variant is never drawn narrower than this (inches)."""

MIN_FONT_KEY = "companion:min-font-pt"
DPI_KEY = "companion:dpi"
"""PNG text chunks: the figure's smallest font (points) and the PNG's dpi."""


def figures_dir(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory figures go to, or ``None`` when saving is switched off."""
    chosen = directory if directory is not None else os.environ.get(FIGURES_ENV)
    return Path(chosen) if chosen else None


def save_figure(fig, name: str, directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write ``fig`` as PNG (150 dpi) and PDF under a stable ``name``; return those two paths.

    A figure whose smallest text would read under :data:`PHONE_MIN_PX` CSS pixels on a phone
    (shown :data:`PHONE_COLUMN_PX` wide: 6.6 in at 150 dpi is shrunk to a third) also gets a
    narrow variant, ``<name>.phone.png`` (:func:`phone_variant`): the same figure laid out
    narrower, its fonts unchanged, which the book serves below :data:`PHONE_BREAKPOINT_PX`.
    Every PNG carries its smallest font size and its dpi as text chunks (:data:`MIN_FONT_KEY`,
    :data:`DPI_KEY`), so that a test of the built book can measure the text as displayed.
    Files are written to a temporary name and renamed, so an interrupted run never leaves a
    half-written figure behind.
    """
    if not _NAME.match(name):
        raise ValueError(f"figure name {name!r} must be lower-case letters, digits, '_' or '-'")
    target = figures_dir(directory)
    if target is None:
        return []
    target.mkdir(parents=True, exist_ok=True)
    smallest = smallest_font_pt(fig)
    png_meta = {MIN_FONT_KEY: f"{smallest:g}", DPI_KEY: f"{PNG_DPI:g}"}
    written = []
    for ext, kwargs in (("png", {"dpi": PNG_DPI, "metadata": png_meta}), ("pdf", {})):
        written.append(_write(fig, target / f"{name}.{ext}", ext, kwargs))
    phone = target / f"{name}{PHONE_SUFFIX}.png"
    with phone_variant(fig, smallest) as narrow:
        if narrow:
            _write(fig, phone, "png", {"dpi": PNG_DPI, "metadata": png_meta})
        else:
            phone.unlink(missing_ok=True)
    _mark_in_notebook(name)
    return written


def _write(fig, final: Path, ext: str, kwargs: dict) -> Path:
    tmp = final.with_name(f".{final.name}.tmp")
    fig.savefig(tmp, format=ext, bbox_inches="tight", **kwargs)
    os.replace(tmp, final)
    return final


def _shown_texts(fig) -> list:
    """The texts a reader sees: visible, not empty, on a visible axes (if any)."""
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text)
            if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible())]


def _drawn(fig):
    """``fig`` drawn on an Agg canvas (layout and tick labels final) and its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def smallest_font_pt(fig) -> float:
    """The smallest font size (points) of any text shown in ``fig``; 10 if it shows none."""
    _drawn(fig)
    sizes = [t.get_fontsize() for t in _shown_texts(fig)]
    return float(min(sizes)) if sizes else 10.0


def saved_width_in(fig) -> float:
    """Width (inches) of the PNG ``save_figure`` writes: the tight box plus its padding."""
    import matplotlib as mpl

    box = fig.get_tightbbox(_drawn(fig))
    return float(box.width) + 2 * float(mpl.rcParams["savefig.pad_inches"])


def phone_text_px(font_pt: float, saved_in: float) -> float:
    """Height in CSS px of a ``font_pt`` font when a figure saved ``saved_in`` inches wide is shown
    :data:`PHONE_COLUMN_PX` wide: ``font_pt / 72 * PHONE_COLUMN_PX / saved_in``."""
    return font_pt / 72.0 * PHONE_COLUMN_PX / saved_in


@contextlib.contextmanager
def phone_variant(fig, smallest_pt: float | None = None) -> Iterator[bool]:
    """Lay ``fig`` out for a phone while the block runs; yields whether it needed to (False: it
    already reads at :data:`PHONE_MIN_PX`, and is left alone).

    The figure is made narrower, fonts and height unchanged, until its smallest font reads at
    least :data:`PHONE_TARGET_PX` at :data:`PHONE_COLUMN_PX` (panels get narrower; nothing is
    added or removed); a legend laid out in several columns that then sticks out of the figure
    gets as many fewer columns as it needs, x tick labels that then run into each other are set at
    an angle, and an x axis label or title wider than its panel (a figure title wider than the
    figure) goes onto two lines. Size, legends and labels
    are restored afterwards, so the notebook shows the figure as drawn.
    """
    smallest = smallest_font_pt(fig) if smallest_pt is None else smallest_pt
    if phone_text_px(smallest, saved_width_in(fig)) >= PHONE_MIN_PX:
        yield False
        return
    size = tuple(fig.get_size_inches())
    legends = [(leg, leg._ncols) for leg in [*fig.legends, *(ax.get_legend() for ax in fig.axes)]
               if leg is not None and getattr(leg, "_ncols", 1) > 1]
    ticks: dict = {}   # tick label -> (rotation, ha, rotation_mode) as drawn, for those set at an angle
    labels: dict = {}  # axis label -> its text as drawn, for those broken onto two lines
    # the widest saved figure whose smallest font still reads PHONE_TARGET_PX on the phone
    goal = smallest / 72.0 * PHONE_COLUMN_PX / PHONE_TARGET_PX
    try:
        for _ in range(6):   # the tight box does not shrink in proportion to the figure: converge
            saved = saved_width_in(fig)
            if phone_text_px(smallest, saved) >= PHONE_MIN_PX:
                break
            width = fig.get_size_inches()[0] * goal / saved
            fig.set_size_inches(max(width, PHONE_NARROWEST_IN), size[1])
            renderer = _drawn(fig)
            for leg, _ in legends:   # a legend that sticks out of the figure widens the PNG: fewer columns
                while leg._ncols > 1 and _sticks_out(leg.get_window_extent(renderer), fig.bbox):
                    _legend_columns(leg, leg._ncols - 1)
                    renderer = _drawn(fig)
            if _angle_crowded_ticks(fig, renderer, ticks) | _break_wide_labels(fig, renderer, labels):
                _drawn(fig)
        yield True
    finally:
        for label, text in labels.items():
            label.set_text(text)
        for label, (rotation, ha, mode) in ticks.items():
            label.set_rotation(rotation)
            label.set_ha(ha)
            label.set_rotation_mode(mode)
        fig.set_size_inches(*size)
        for leg, ncols in legends:
            if leg._ncols != ncols:
                _legend_columns(leg, ncols)


def _angle_crowded_ticks(fig, renderer, saved: dict) -> bool:
    """Set the x tick labels of each axes whose neighbouring labels overlap at 35 degrees (right
    end at the tick), noting how each was drawn in ``saved``; returns whether any was changed."""
    changed = False
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text().strip()]
        boxes = sorted((t.get_window_extent(renderer) for t in labels if t.get_rotation() == 0), key=lambda b: b.x0)
        if not any(a.x1 > b.x0 + 1 for a, b in zip(boxes, boxes[1:])):
            continue
        for label in labels:
            saved.setdefault(label, (label.get_rotation(), label.get_ha(), label.get_rotation_mode()))
            label.set_rotation(35)
            label.set_ha("right")
            label.set_rotation_mode("anchor")
        changed = True
    return changed


def _break_wide_labels(fig, renderer, saved: dict) -> bool:
    """Break onto two lines each x axis label or title wider than its panel and a figure title that
    sticks out of the figure, at the space nearest its middle outside math (``$...$``), noting its
    text in ``saved``; returns whether any was broken."""
    wide = []
    for ax in fig.axes:
        wide += [t for t in (ax.xaxis.label, ax.title, ax._left_title, ax._right_title)
                 if t.get_visible() and t.get_window_extent(renderer).width > ax.bbox.width + 1]
    title = getattr(fig, "_suptitle", None)
    if title is not None and title.get_visible() and _sticks_out(title.get_window_extent(renderer), fig.bbox):
        wide.append(title)
    changed = False
    for label in wide:
        text = label.get_text()
        spaces = [i for i, c in enumerate(text) if c == " " and text[:i].count("$") % 2 == 0]
        if label in saved or "\n" in text or not spaces:
            continue
        at = min(spaces, key=lambda i: abs(i - len(text) / 2))
        saved[label] = text
        label.set_text(text[:at] + "\n" + text[at + 1:])
        changed = True
    return changed


def _sticks_out(box, figure_box) -> bool:
    """Whether ``box`` reaches past the left or right edge of the figure (a pixel's slack)."""
    return bool(box.x0 < figure_box.x0 - 1 or box.x1 > figure_box.x1 + 1)


def _legend_columns(legend, ncols: int) -> None:
    """Lay ``legend``'s entries out again in ``ncols`` columns, same entries, same order.

    ``Legend.set_ncols`` only takes effect when a legend is made, so its box is rebuilt from its
    own handles and labels (matplotlib's ``_init_legend_box``, as ``Legend.__init__`` does).
    """
    labels = [t.get_text() for t in legend.texts]
    colors = [t.get_color() for t in legend.texts]
    title = legend.get_title()
    heading, font = title.get_text(), title.get_fontproperties()
    legend.set_ncols(ncols)
    legend._init_legend_box(list(legend.legend_handles), labels)
    legend._set_loc(legend._loc)         # the new box's place (set_loc would forget "outside")
    legend.set_title(heading, prop=font)
    for text, color in zip(legend.texts, colors):
        text.set_color(color)


def _mark_in_notebook(name: str) -> None:
    """Leave ``<!-- companion-figure: name -->`` in the running cell's output (kernels only)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    display({"text/markdown": f"<!-- companion-figure: {name} -->"}, raw=True)
