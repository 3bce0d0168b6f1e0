"""What the event-driven replay reports: per-run files, a comparison table, plots over time.

A run is written as one JSON file (its knobs, inputs fingerprint, totals and sampled series)
with an atomic rename, so a sweep killed mid-write leaves either the whole file or none, and a
rerun can trust every file it finds. The comparison table has one row per run; its columns are
the knobs that differ between runs, then the figures a platform team decides by.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpufrag.plotting import pyplot

# (column, title, format) of the comparison table, from the totals of each run.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("gpu_hours_allocated", "GPU-h alloc", ".0f"),
    ("gpu_hours_used", "GPU-h used", ".0f"),
    ("mean_allocation_pct", "alloc %", ".2f"),
    ("mean_frag_ratio", "frag", ".3f"),
    ("mean_idle_ratio", "idle", ".3f"),
    ("pending_pod_s", "pending pod-s", ".0f"),
    ("pods_waited", "waited", ".0f"),
    ("wait_p99_s", "wait p99 s", ".1f"),
    ("cold_starts", "cold starts", ".0f"),
    ("cold_start_s", "cold s", ".0f"),
    ("over_slo_pct", "over SLO %", ".3f"),
    ("evictions", "evictions", ".0f"),
)
SERIES = (("allocated_gpus", "allocated GPUs"), ("used_gpus", "used GPUs (busy)"),
          ("frag_ratio", "fragmentation ratio"), ("idle_ratio", "idle ratio"),
          ("pending_pods", "pending pods"), ("ready_replicas", "ready replicas"),
          ("cold_starts", "cold starts (cumulative)"), ("evictions", "evictions (cumulative)"))
# Lines drawn per plot at most: past this a plot is unreadable, the table says the rest.
MAX_LINES = 24


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file, or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_run(path: Path) -> dict[str, Any] | None:
    """A run file, or None when it is not one (a foreign or damaged file is redone)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not {"run_id", "config", "totals", "samples"} <= set(
            record):
        return None
    return record


def varying(records: Sequence[dict[str, Any]]) -> list[str]:
    """The knobs whose value differs between ``records`` (policy and seed first)."""
    if not records:
        return []
    keys = list(records[0]["config"])
    differ = [k for k in keys if len({json.dumps(r["config"].get(k)) for r in records}) > 1]
    first = [k for k in ("policy", "seed") if k in differ]
    return first + [k for k in differ if k not in first]


def label(record: dict[str, Any], knobs: Sequence[str]) -> str:
    if not knobs:
        return str(record["config"].get("policy", "run"))
    return " ".join(f"{record['config'][k]}" if k == "policy" else f"{k}={record['config'][k]}"
                    for k in knobs)


def comparison_rows(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the comparison: varying knobs, then the figures (as text)."""
    knobs = varying(records) or ["policy"]
    header = [*knobs, *(title for _, title, _ in COLUMNS)]
    rows = []
    for r in records:
        totals = r["totals"]
        rows.append([str(r["config"][k]) for k in knobs]
                    + [format(float(totals.get(c, 0.0)), f) for c, _, f in COLUMNS])
    return header, rows


def table(records: Sequence[dict[str, Any]]) -> str:
    header, rows = comparison_rows(records)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "-" * len(line)]
    out += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(out)


def write_comparison(records: Sequence[dict[str, Any]], out: Path) -> Path:
    knobs = varying(records) or ["policy"]
    lines = [[*knobs, "run_id", *(c for c, _, _ in COLUMNS)]]
    for r in records:
        lines.append([*(r["config"][k] for k in knobs), r["run_id"],
                      *(r["totals"].get(c, 0.0) for c, _, _ in COLUMNS)])
    path = out / "comparison.csv"
    with path.open("w", newline="") as handle:
        csv.writer(handle).writerows(lines)
    return path


def plot(records: Sequence[dict[str, Any]], out: Path, title: str) -> Path:
    """One PNG: each series over time (hours), one line per run (the first ``MAX_LINES``)."""
    plt = pyplot()

    knobs = varying(records)
    fig, axes = plt.subplots(2, 4, figsize=(17, 7.5), sharex=True)
    for record in records[:MAX_LINES]:
        samples = record["samples"]
        hours = np.array(samples["t_s"]) / 3600.0
        for ax, (name, _) in zip(axes.flat, SERIES, strict=True):
            ax.plot(hours, samples[name], label=label(record, knobs), linewidth=1.1)
    for ax, (_, text) in zip(axes.flat, SERIES, strict=True):
        ax.set_title(text, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("hours")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path = out / "timeline.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
