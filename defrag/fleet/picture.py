"""``gpufrag inspect --plot FILE``: every GPU of the fleet, node by node, in one picture.

Each GPU is a bar split into used, reserved but idle, reserved with no reading and free
(:mod:`defrag.fleet.split`); each node is a row; a node over the defrag trigger is marked
(a red triangle before its row, its name in red). That reads well to about a hundred nodes
(:data:`BARS_MAX_NODES`). Past it the same picture is drawn compact: one pixel row per node,
each GPU a strip of :data:`STRIP_PX` pixels coloured by the same parts, the mark a red cell
before the row, and the nodes wrapped into side-by-side panels of :data:`PANEL_ROWS` rows, so
5,000 nodes still fit a screen and a few hundred kilobytes (tests/defrag/fleet measure it).

The file's suffix picks the format (``.png`` or ``.svg``). It is written to a temporary file
beside it and renamed into place, so a failure leaves nothing partial behind; a bad FILE (an
unknown suffix, a folder that does not exist or cannot be written) is refused before the
cluster is read (:func:`check_target`).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from defrag.fleet.split import PARTS, fleet_split
from gpufrag.errors import BadInput
from gpufrag.plotting import pyplot, save_figure

SUFFIXES: Final = (".png", ".svg")
BARS_MAX_NODES: Final = 120
STRIP_PX: Final = 12  # pixels per GPU in the compact form
PANEL_ROWS: Final = 1000  # node rows per panel in the compact form
MARK_PX: Final = 4
# used, reserved but idle, reserved with no reading, free
COLOURS: Final = ("#2b6cb0", "#ed8936", "#a0aec0", "#edf2f7")
MARK_COLOUR: Final = "#c53030"
MARK_GID: Final = "over-trigger"


@dataclass(frozen=True, slots=True)
class Picture:
    path: Path
    form: str  # "bars" or "strips"
    nodes: int
    marked: int
    size_bytes: int


def check_target(path: Path) -> str:
    """The format ``path`` asks for; BadInput (exit 2) naming the fix when it cannot be
    written: called before anything is read, so a typo costs nothing."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise BadInput(f"{str(path)!r} has the suffix {path.suffix or '(none)'!r}; the picture "
                       f"is written as {' or '.join(SUFFIXES)}: name the file so",
                       field="--plot")
    folder = path.parent
    if not folder.is_dir():
        raise BadInput(f"{str(path)!r}: the folder {str(folder)!r} does not exist; create it "
                       "or write the picture elsewhere", field="--plot")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(f"{str(path)!r}: the folder {str(folder)!r} cannot be written here",
                       field="--plot")
    if path.is_dir():
        raise BadInput(f"{str(path)!r} is a folder; name a file", field="--plot")
    return suffix


def rgb(colour: str) -> npt.NDArray[np.uint8]:
    return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], np.uint8)


def strip_image(splits: Sequence[npt.NDArray[np.float64]], over: Sequence[bool],
                width_gpus: int) -> npt.NDArray[np.uint8]:
    """[node, pixel, RGB]: the compact form's rows. Each GPU's pixels are given to the parts
    in order, rounded on the running total so a GPU's strip always fills its width."""
    colours = np.stack([rgb(c) for c in COLOURS])
    white = np.full(3, 255, np.uint8)
    image = np.empty((len(splits), MARK_PX + width_gpus * STRIP_PX, 3), np.uint8)
    image[:] = white
    for row, split in enumerate(splits):
        if over[row]:
            image[row, : MARK_PX - 1] = rgb(MARK_COLOUR)
        if not len(split):
            continue
        # where each part ends, in pixels; a pixel's part is how many ends lie at or before it
        edges = np.rint(np.cumsum(split, axis=1) * STRIP_PX).astype(np.int64)
        pixel = np.arange(STRIP_PX)
        part = np.minimum((pixel[None, None, :] >= edges[:, :, None]).sum(axis=1),
                          len(COLOURS) - 1)
        cells = colours[part]  # [gpu, pixel, RGB]
        cells[:, -1] = white  # a gap between GPUs
        image[row, MARK_PX: MARK_PX + len(split) * STRIP_PX] = cells.reshape(-1, 3)
    return image


def _legend(where: Any, plt: Any, **placed: Any) -> None:
    """The parts and the mark, on an axes or a figure (``placed``: where)."""
    patches = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS]
    marker = plt.Line2D([], [], marker=">", color=MARK_COLOUR, linestyle="none")
    where.legend([*patches, marker], [*PARTS, "node over the idle trigger"], ncol=5,
                 fontsize=8, frameon=False, **placed)


def _bars(plt: Any, nodes: Sequence[Mapping[str, Any]],
          splits: Sequence[npt.NDArray[np.float64]], over: Sequence[bool], width: int,
          title: str) -> Any:
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.9 * width), 1.6 + 0.24 * len(nodes)))
    ys, xs, parts = [], [], []
    for row, split in enumerate(splits):
        for gpu in range(len(split)):
            ys.append(row)
            xs.append(gpu)
            parts.append(split[gpu])
    if parts:
        y, x, share = np.array(ys), np.array(xs, float), np.array(parts)
        left = x.copy()
        for p, colour in enumerate(COLOURS):
            ax.barh(y, share[:, p] * 0.9, left=left, height=0.7, color=colour,
                    edgecolor="none")
            left = left + share[:, p] * 0.9
    marked = [row for row, is_over in enumerate(over) if is_over]
    ax.scatter([-0.25] * len(marked), marked, marker=">", color=MARK_COLOUR, s=30,
               gid=MARK_GID, clip_on=False)
    ax.set_yticks(range(len(nodes)), [n["node"] for n in nodes], fontsize=8)
    for label, is_over in zip(ax.get_yticklabels(), over, strict=True):
        if is_over:
            label.set_color(MARK_COLOUR)
    ax.set_ylim(len(nodes) - 0.5, -0.5)
    ax.set_xlim(-0.45, max(width, 1))
    ax.set_xticks([g + 0.45 for g in range(width)], [f"GPU {g}" for g in range(width)],
                  fontsize=8)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    _legend(ax, plt, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    ax.set_title(title, fontsize=10, pad=28)
    fig.tight_layout()
    return fig


def _strips(plt: Any, nodes: Sequence[Mapping[str, Any]],
            splits: Sequence[npt.NDArray[np.float64]], over: Sequence[bool], width: int,
            title: str) -> Any:
    image = strip_image(splits, over, width)
    panels = max(1, math.ceil(len(nodes) / PANEL_ROWS))
    rows = min(len(nodes), PANEL_ROWS)
    dpi = 100
    height = rows / dpi + 2.2  # inches: a pixel row per node, and room for title and legend
    fig, axes = plt.subplots(1, panels, squeeze=False, dpi=dpi,
                             figsize=(max(9.0, panels * (image.shape[1] + 70) / dpi), height))
    for i, ax in enumerate(axes[0]):
        part = image[i * PANEL_ROWS:(i + 1) * PANEL_ROWS]
        ax.imshow(part, aspect="auto", interpolation="nearest",
                  extent=(0, part.shape[1], i * PANEL_ROWS + len(part) - 0.5,
                          i * PANEL_ROWS - 0.5))
        first, last = i * PANEL_ROWS, i * PANEL_ROWS + len(part) - 1
        ax.set_title(f"{nodes[first]['node']}\n... {nodes[last]['node']}", fontsize=7)
        ax.set_xticks([])
        ax.tick_params(labelsize=7)
        ax.set_ylabel("node row" if i == 0 else "", fontsize=8)
    fig.suptitle(title + f"\none pixel row per node, {STRIP_PX} px per GPU", fontsize=10,
                 y=1 - 0.1 / height)
    _legend(fig, plt, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.6 / height))
    fig.subplots_adjust(top=1 - 1.6 / height, bottom=0.2 / height, wspace=0.7)
    return fig


def draw(doc: Mapping[str, Any], path: Path, *, cluster: str, at: str) -> Picture:
    """Draw inspect's document ``doc`` into ``path`` (checked by :func:`check_target`)."""
    suffix = check_target(path)
    nodes: Sequence[Mapping[str, Any]] = doc["nodes"]
    splits = fleet_split(nodes)
    over = [n["trigger"] == "over" for n in nodes]
    width = max((len(s) for s in splits), default=0)
    title = (f"GPUs of {cluster} at {at}: {len(nodes):,} node(s), "
             f"{sum(len(s) for s in splits):,} GPU(s); {sum(over):,} node(s) over the "
             f"{float(doc['threshold']):.0%} idle trigger")
    plt = pyplot()
    form = "bars" if len(nodes) <= BARS_MAX_NODES else "strips"
    fig = (_bars if form == "bars" else _strips)(plt, nodes, splits, over, width, title)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix,
                                         dir=path.parent)
    os.close(handle)
    umask = os.umask(0)  # mkstemp makes the file private; the picture gets the usual mode
    os.umask(umask)
    try:
        os.chmod(temporary, 0o666 & ~umask)
        with plt.rc_context({"svg.fonttype": "none", "svg.hashsalt": "gpufrag"}):
            save_figure(fig, path.parent, Path(temporary).name)
        os.replace(temporary, path)
    except BaseException:
        plt.close(fig)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return Picture(path, form, len(nodes), sum(over), path.stat().st_size)
