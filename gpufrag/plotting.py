"""matplotlib where it is installed: the what-if's and the demo's plots, and nothing else.

Why optional: matplotlib and what it brings (fonttools, pillow, contourpy, kiwisolver, ...) are
~90 MB that no cluster component uses, so the cluster image leaves them out (Dockerfile;
docs/node.md gives the sizes). A pip install still gets them: they are in gpufrag's default
dependencies (``requirements/plot.in``) and in the ``plot`` extra, for an environment made from
the image's dependencies. Where matplotlib is missing, the what-if commands still write their
CSV and JSON and say in one line that the plots were skipped (:func:`plots_wanted`); a command
whose only output is a plot fails with :class:`PlottingUnavailable`, which names the extra.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Final, TextIO

PLOT_EXTRA: Final = "plot"


class PlottingUnavailable(RuntimeError):
    """matplotlib is not installed here; the message says how to add it."""


def missing_reason() -> str | None:
    """None where plots can be drawn, else why not and the fix, in one sentence. Imports
    matplotlib to find out (once per process; a command that asks is about to plot): an
    installed but broken one is as missing as an absent one."""
    try:
        importlib.import_module("matplotlib")
    except ImportError as exc:
        return (f"matplotlib cannot be imported ({exc}; the images leave the what-if's "
                f"plotting out); install the '{PLOT_EXTRA}' extra to draw them: "
                f"pip install 'gpufrag[{PLOT_EXTRA}]'")
    return None


def pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend (no display in a pod or on CI)."""
    reason = missing_reason()
    if reason is not None:
        raise PlottingUnavailable(f"cannot plot: {reason}")
    importlib.import_module("matplotlib").use("Agg")
    return importlib.import_module("matplotlib.pyplot")


def plots_wanted(no_plots: bool, prog: str, *, stream: TextIO | None = None) -> bool:
    """Whether a command that writes plots beside its tables should draw them: not when
    ``--no-plots`` was given, nor where matplotlib is missing (then one line on ``stream``,
    default stderr, says so and how to get them; the tables are written all the same)."""
    if no_plots:
        return False
    reason = missing_reason()
    if reason is None:
        return True
    print(f"{prog}: plots skipped: {reason}", file=stream or sys.stderr)
    return False


def save_figure(fig: Any, out: Path, name: str, *, dpi: int = 110) -> Path:
    """Write ``fig`` as ``out/name`` (making ``out``) and close it: a figure left open keeps
    its memory for the life of a process that draws many."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    fig.savefig(path, dpi=dpi)
    importlib.import_module("matplotlib.pyplot").close(fig)
    return path
