"""Write what-if results: the FGD authors' CSV layout, a summary JSON, plots and a table."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufrag.plotting import pyplot
from simulations.replay import FloatArray, ReplayResult, bucket_by_arrival

METRICS = {
    "allocation": "allocation_pct",
    "frag_ratio": "frag_ratio_pct",
    "frag_amount": "frag_amount_pct",
}


@dataclass(frozen=True)
class RunRecord:
    workload: str
    tune: float
    result: ReplayResult
    seconds: float

    def series(self, metric: str, columns: int) -> FloatArray:
        r = self.result
        initial = 100.0 if metric == "frag_ratio" else 0.0
        values = getattr(r, METRICS[metric])
        return bucket_by_arrival(r.arrived_pct, values, columns, initial=initial)


def columns_for(tune: float) -> int:
    return round(tune * 100) + 1


def write_csvs(records: list[RunRecord], out: Path, columns: int) -> list[Path]:
    written = []
    for metric in METRICS:
        path = out / f"{metric}.csv"
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["workload", "sc_policy", "tune", "seed", *range(columns)])
            for rec in records:
                values = rec.series(metric, columns)
                writer.writerow([rec.workload, rec.result.policy, rec.tune, rec.result.seed,
                                 *(f"{v:.4f}" for v in values)])
        written.append(path)
    return written


@dataclass(frozen=True)
class PolicySummary:
    policy: str
    runs: int
    allocation_at_100: float
    allocation_at_end: float
    frag_ratio_at_100: float
    placed: float
    failed: float
    seconds: float


def summarise(records: list[RunRecord], columns: int) -> list[PolicySummary]:
    by_policy: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in records:
        by_policy[rec.result.policy].append(rec)
    at100 = min(100, columns - 1)
    out = []
    for policy, recs in by_policy.items():
        alloc = np.array([r.series("allocation", columns) for r in recs])
        ratio = np.array([r.series("frag_ratio", columns) for r in recs])
        out.append(PolicySummary(
            policy=policy, runs=len(recs),
            allocation_at_100=float(alloc[:, at100].mean()),
            allocation_at_end=float(alloc[:, -1].mean()),
            frag_ratio_at_100=float(ratio[:, at100].mean()),
            placed=float(np.mean([r.result.placed for r in recs])),
            failed=float(np.mean([r.result.failed for r in recs])),
            seconds=float(np.mean([r.seconds for r in recs])),
        ))
    return sorted(out, key=lambda s: -s.allocation_at_end)


def table(summaries: list[PolicySummary], columns: int) -> str:
    end = columns - 1
    head = (f"{'policy':<16}{'runs':>5}{'alloc@100%':>12}{f'alloc@{end}%':>12}"
            f"{'frag@100%':>11}{'placed':>9}{'failed':>9}{'sec/run':>9}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        lines.append(f"{s.policy:<16}{s.runs:>5}{s.allocation_at_100:>12.2f}"
                     f"{s.allocation_at_end:>12.2f}{s.frag_ratio_at_100:>11.2f}"
                     f"{s.placed:>9.0f}{s.failed:>9.0f}{s.seconds:>9.2f}")
    return "\n".join(lines)


def write_summary(summaries: list[PolicySummary], out: Path, meta: dict[str, object]) -> Path:
    path = out / "summary.json"
    payload = {**meta, "policies": [vars(s) | {} for s in summaries]}
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def plot(records: list[RunRecord], out: Path, columns: int, title: str) -> list[Path]:
    """One PNG per metric: mean over seeds vs arrived demand, one line per policy."""
    plt = pyplot()

    by_policy: dict[str, list[RunRecord]] = defaultdict(list)
    for rec in records:
        by_policy[rec.result.policy].append(rec)
    x = np.arange(columns)
    written = []
    for metric, label in (("allocation", "GPU allocation (% of capacity)"),
                          ("frag_ratio", "fragmentation ratio (% of free GPU)")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for policy, recs in sorted(by_policy.items()):
            ax.plot(x, np.mean([r.series(metric, columns) for r in recs], axis=0), label=policy)
        ax.set_xlabel("arrived GPU demand (% of capacity)")
        ax.set_ylabel(label)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if metric == "allocation":
            ax.set_xlim(50, columns - 1)
            ax.set_ylim(50, 100)
        fig.tight_layout()
        path = out / f"{metric}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
