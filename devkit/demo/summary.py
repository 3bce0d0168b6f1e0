"""The demo's options, its before/after phases, and the summary: JSON, table and plot."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from devkit.demo.load import STANDIN_MODEL, LoadResult
from devkit.demo.scenario import MILLI_PER_GPU
from gpufrag.errors import BadInput
from gpufrag.plotting import pyplot

MIN_NODES, MAX_NODES = 4, 64


@dataclass(frozen=True, slots=True)
class DemoOptions:
    out: Path = Path("demo-out")
    nodes: int = 8
    seed: int = 0
    load_s: float = 5.0  # seconds of load per phase
    rate_per_s: float = 20.0  # requests per second to each stand-in
    keep_running: bool = False

    def validate(self) -> DemoOptions:
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise BadInput(f"must be in {MIN_NODES}..{MAX_NODES}, got {self.nodes}",
                           field="--nodes")
        if not 0.5 <= self.load_s <= 120:
            raise BadInput(f"must be in 0.5..120 seconds, got {self.load_s}", field="--load-s")
        if not 1 <= self.rate_per_s <= 500:
            raise BadInput(f"must be in 1..500 requests/s, got {self.rate_per_s}",
                           field="--rate")
        return self


@dataclass
class Phase:
    """The cluster and the serving path at one point: before or after the defrag cycle."""

    measured: dict[str, Any]  # defrag.controller.measure.Summary.as_dict()
    layout: dict[str, list[int]]  # node -> allocated milli per GPU
    load: LoadResult
    placement: dict[str, int]  # ColdLoads.as_dict() of the placements this phase stands for
    placed_by: str

    def as_dict(self) -> dict[str, Any]:
        return {**self.measured, **self.placement, "placed_by": self.placed_by,
                **self.load.as_dict()}


@dataclass
class DemoSummary:
    options: DemoOptions
    nodes: list[dict[str, Any]]
    gpu_memory_source: str
    before: Phase
    after: Phase
    deployments: list[dict[str, Any]]
    defrag: dict[str, Any]
    standins: list[dict[str, Any]]
    phases_s: dict[str, float]
    runtime_s: float
    extender_url: str = ""
    namespace: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.options.seed, "nodes": self.nodes,
            "gpu_memory_source": self.gpu_memory_source,
            "before": self.before.as_dict(), "after": self.after.as_dict(),
            "layout": {"before": self.before.layout, "after": self.after.layout},
            "namespace": self.namespace, "extender_url": self.extender_url,
            "deployments": self.deployments, "defrag": self.defrag, "standins": self.standins,
            "load": {"seconds": self.options.load_s, "rate_per_standin": self.options.rate_per_s,
                     "open_loop": True},
            "phases_s": self.phases_s, "runtime_s": round(self.runtime_s, 1),
        }


ROWS: tuple[tuple[str, str, Callable[[Phase], str]], ...] = (
    ("fragmentation ratio (FGD)", "lower",
     lambda p: f"{p.measured['frag_ratio']:.1%} ({p.measured['frag_gpus']:.2f} GPUs)"),
    ("idle ratio (reserved, unused)", "lower",
     lambda p: f"{p.measured['idle_ratio']:.1%} ({p.measured['idle_gib']:.0f} GiB)"),
    ("free whole GPUs", "higher", lambda p: str(p.measured["free_whole_gpus"])),
    ("cold loads avoided by affinity", "higher",
     lambda p: f"{p.placement['cold_loads_avoided']} of {p.placement['placements']} "
               f"({p.placed_by})"),
    ("request p99 (ms)", "lower",
     lambda p: f"{p.load.p99_ms:.1f} (p50 {p.load.p50_ms:.1f})"),
    ("requests (errors)", "", lambda p: f"{p.load.requests} ({p.load.errors})"),
    ("mean batch size", "", lambda p: f"{p.load.mean_batch:.2f}"),
)


def summary_table(summary: DemoSummary) -> str:
    b, a = summary.before, summary.after
    cells = [(name, fmt(b), fmt(a)) for name, _, fmt in ROWS]
    w0 = max(len(c[0]) for c in cells)
    w1 = max(len(c[1]) for c in [*cells, ("", "before defrag", "")])
    lines = [f"  {'':<{w0}}  {'before defrag':<{w1}}  after defrag",
             "  " + "-" * (w0 + w1 + 16)]
    lines += [f"  {n:<{w0}}  {x:<{w1}}  {y}" for n, x, y in cells]
    return "\n".join(lines)


def write_plot(summary: DemoSummary, path: Path) -> None:
    """Per-GPU allocation before/after (the fragmentation you can see) and the headline bars."""
    plt = pyplot()

    nodes = list(summary.before.layout)
    width = max(len(v) for v in summary.before.layout.values())
    fig = plt.figure(figsize=(15, 8.5), constrained_layout=True)
    grid = fig.add_gridspec(2, 5, height_ratios=[1.25, 1])
    for col, (label, phase) in enumerate((("before defrag", summary.before),
                                          ("after defrag", summary.after))):
        ax = fig.add_subplot(grid[0, :2] if col == 0 else grid[0, 3:])
        cells = np.full((len(nodes), width), np.nan)
        for i, node in enumerate(nodes):
            row = phase.layout.get(node, [])
            cells[i, :len(row)] = row
        image = ax.imshow(cells, cmap="viridis", vmin=0, vmax=MILLI_PER_GPU, aspect="auto")
        for (i, g), value in np.ndenumerate(cells):
            if value > 0:
                ax.text(g, i, f"{value:.0f}", ha="center", va="center", fontsize=7,
                        color="black" if value > MILLI_PER_GPU * 0.6 else "white")
        ax.set_yticks(range(len(nodes)), nodes, fontsize=8)
        ax.set_xticks(range(width), [str(g) for g in range(width)], fontsize=8)
        ax.set_xlabel("GPU index")
        ax.set_title(f"{label}: allocated milli-GPU per GPU "
                     f"({phase.measured['free_whole_gpus']} whole GPUs free)", fontsize=10)
    fig.colorbar(image, ax=fig.axes[-1], shrink=0.8, label="allocated milli-GPU")
    notes = fig.add_subplot(grid[0, 2])
    notes.axis("off")
    notes.text(0.0, 0.95, _plot_note(summary), va="top", fontsize=8, family="monospace",
               wrap=True)
    bars: list[tuple[str, float, float]] = [
        ("fragmentation ratio", summary.before.measured["frag_ratio"],
         summary.after.measured["frag_ratio"]),
        ("idle ratio", summary.before.measured["idle_ratio"],
         summary.after.measured["idle_ratio"]),
        ("free whole GPUs", summary.before.measured["free_whole_gpus"],
         summary.after.measured["free_whole_gpus"]),
        ("placements that avoided a cold load",
         summary.before.placement["cold_loads_avoided"] / max(1, summary.before.placement[
             "placements"]),
         summary.after.placement["cold_loads_avoided"] / max(1, summary.after.placement[
             "placements"])),
        ("request p99 (ms)", summary.before.load.p99_ms, summary.after.load.p99_ms),
    ]
    for i, (title, before, after) in enumerate(bars):
        ax = fig.add_subplot(grid[1, i])
        ax.bar(["before", "after"], [before, after], color=["#b0b0b0", "#2a7ab9"])
        ax.set_title(title, fontsize=10)
        for x, v in enumerate((before, after)):
            text = f"{v:.0f}" if title.startswith("free") or "ms" in title else f"{v:.1%}"
            ax.annotate(text, (x, v), ha="center", va="bottom", fontsize=9)
    fig.suptitle(f"gpufrag demo: {len(nodes)} fake GPU nodes, one defrag cycle "
                 f"(seed {summary.options.seed}; GPU memory: {summary.gpu_memory_source})",
                 fontsize=11)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_note(summary: DemoSummary) -> str:
    d = summary.defrag
    return (f"defrag: {d['moves_planned']} moves planned\n"
            f"  {d['landed_on_hint']} replacements on the\n  hinted node\n"
            f"before: spread placement\n  ({summary.before.placement['placements']} replicas)\n"
            f"after: gpufrag-scheduler\n  ({summary.after.placement['placements']} replicas:\n"
            f"  scale-up + defrag)\n"
            f"stand-ins: {len(summary.standins)} x\n  gpufrag serve\n  {STANDIN_MODEL}")
