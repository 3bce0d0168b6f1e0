"""The plan and the cycle's result, as a table for people or JSON lines for tools."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from defrag.controller.executor import CycleReport
from defrag.controller.model import UsageNote
from defrag.controller.planner import Plan
from defrag.controller.rightsize import RightsizingReport

MAX_SKIP_LINES = 12


def _gpus(gpus: tuple[int, ...]) -> str:
    return ",".join(str(g) for g in gpus) or "-"


def plan_table(plan: Plan, notes: Sequence[UsageNote] = (), *, dry_run: bool = False) -> str:
    lines = [f"defrag plan{' (dry run)' if dry_run else ''}: {len(plan.moves)} move"
             f"{'' if len(plan.moves) == 1 else 's'}; {len(plan.triggered)} triggered node"
             f"{'' if len(plan.triggered) == 1 else 's'}; {plan.scored} candidate moves scored "
             f"in {plan.seconds:.2f}s"]
    if plan.moves:
        head = (f"  {'#':>3}  {'pod':<40} {'GPU':>6}  {'from (gpus)':<24} {'to (gpus)':<24}"
                f" {'dFrag':>7} {'dIdle':>8} {'freed':>5}  cuts; reason")
        lines += [head, "  " + "-" * (len(head) - 2)]
        for i, m in enumerate(plan.moves, 1):
            size = f"{m.gpu_milli}m" if m.gpu_milli < 1000 else f"{m.num_gpu}"
            if m.new_milli:
                size = f"{m.gpu_milli}>{m.new_milli}m"
            lines.append(
                f"  {i:>3}  {m.pod[:40]:<40} {size:>6}  "
                f"{(m.source + ' (' + _gpus(m.source_gpus) + ')')[:24]:<24} "
                f"{(m.target + ' (' + _gpus(m.target_gpus) + ')')[:24]:<24} "
                f"{m.frag_delta_milli / 1000:>+7.2f} {m.idle_delta_mib / 1024:>+7.1f}G "
                f"{m.freed_gpus:>5}  {'+'.join(m.purposes) or '-'}; {m.reason}"
                + (f"; unblocks {', '.join(m.unblocks)}" if m.unblocks else ""))
    b, a = plan.before, plan.after
    lines.append(f"  before: idle {b.idle_ratio:.1%} ({b.idle_gib:.1f} GiB), fragmentation "
                 f"{b.frag_ratio:.1%} ({b.frag_gpus:.2f} GPUs), {b.free_whole_gpus} free whole "
                 f"GPUs")
    lines.append(f"  after (predicted): idle {a.idle_ratio:.1%} ({a.idle_gib:.1f} GiB), "
                 f"fragmentation {a.frag_ratio:.1%} ({a.frag_gpus:.2f} GPUs), "
                 f"{a.free_whole_gpus} free whole GPUs")
    if plan.daily is not None:
        d = plan.daily
        lines.append(f"  daily budget: {d.left} eviction{'' if d.left == 1 else 's'} left "
                     f"({d.pct:g}% of {d.running} running GPU pods = {d.allowed} in any 24 "
                     f"hours; {d.spent} in the last 24 hours)")
    if plan.skipped:
        lines.append("  not moved:")
        ranked = sorted(plan.skipped.items(), key=lambda kv: (-kv[1], kv[0]))
        lines += [f"    {n:>6}  {reason}" for reason, n in ranked[:MAX_SKIP_LINES]]
    if plan.not_actionable:
        lines.append(f"  not actionable ({len(plan.not_actionable)} triggered on idle memory "
                     "that no right-sizing reclaims; set these workloads to auto):")
        for node, workloads in list(sorted(plan.not_actionable.items()))[:MAX_SKIP_LINES]:
            shown = ", ".join(workloads[:3]) + (" ..." if len(workloads) > 3 else "")
            lines.append(f"    {node}: {shown}")
    if plan.unplaceable:
        shown = ", ".join(plan.unplaceable[:5]) + (" ..." if len(plan.unplaceable) > 5 else "")
        lines.append(f"  pending GPU pods that fit nowhere now: {len(plan.unplaceable)} "
                     f"({shown})")
    for note in notes:
        lines.append(f"  usage ignored on {note.node}: {note.reason}")
    return "\n".join(lines)


def plan_json(plan: Plan, notes: Sequence[UsageNote] = (), *, dry_run: bool = False) -> str:
    doc: dict[str, Any] = {"kind": "plan", "dry_run": dry_run, **plan.as_dict(),
                           "usage_notes": [{"node": n.node, "reason": n.reason} for n in notes]}
    return orjson.dumps(doc).decode()


def result_json(report: CycleReport, counts: dict[str, int], *, dry_run: bool,
                convergence: Mapping[str, Any] | None = None,
                rightsizing: RightsizingReport | None = None) -> str:
    doc: dict[str, Any] = {
        "kind": "result", "dry_run": dry_run, "ok": report.error is None, "error": report.error,
        "stopped_early": report.stopped_early or None,
        "moves": [{"pod": r.move.pod, "outcome": r.outcome, "target": r.move.target,
                   "landed_on": r.landed_on, "replacement": r.replacement}
                  for r in report.results],
        "skipped": [{"pod": m.pod, "reason": why} for m, why in report.skipped],
        "counts": counts,
        "before": report.before.as_dict() if report.before else None,
        "after": report.after.as_dict() if report.after else None,
        "convergence": dict(convergence) if convergence is not None else None,
        "rightsizing": None if rightsizing is None else {
            "published": [p.as_dict() for p in rightsizing.published],
            "rightsized": dict(sorted(rightsizing.rightsized.items())),
            "skipped": dict(sorted(rightsizing.skipped.items())),
            "raised": [{"workload": w, "model_version": v, "used_mib": u, "floor_mib": f}
                       for w, v, u, f in rightsizing.raised],
            "problems": rightsizing.problems},
    }
    return orjson.dumps(doc).decode()


def rightsizing_lines(report: RightsizingReport, *, dry_run: bool = False) -> list[str]:
    """The recommendations of this cycle, one line per workload and model version."""
    verb = "would publish" if dry_run else "published"
    lines = [f"right-sizing: {len(report.published)} workload(s); "
             f"{sum(p.written for p in report.published)} annotation(s) {verb}; "
             f"{len(report.rightsized)} replica(s) right-sized if moved"]
    for p in report.published[:MAX_SKIP_LINES]:
        for version, r in sorted(p.recommendations.items()):
            lines.append(f"  {p.workload.text[:48]:<48} {version[:12]:<12} {p.mode.value:<9} "
                         f"{r.memory_mib:>7} MiB {r.milli:>5}m (peak {r.peak_mib} MiB, "
                         f"{r.samples} samples)")
    lines += [f"  raised: {text} {version}: a replica used {used} MiB past its share; at least "
              f"{floor} MiB from now on, new pods admitted as asked for the cool-off"
              for text, version, used, floor in report.raised[:MAX_SKIP_LINES]]
    lines += [f"  left alone: {problem}" for problem in report.problems[:MAX_SKIP_LINES]]
    return lines
