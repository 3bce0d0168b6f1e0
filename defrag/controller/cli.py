"""``gpufrag defrag``: one defragmentation cycle (run it as a CronJob).

Read the cluster -> measure -> trigger -> plan (printed before anything is evicted) -> act ->
summary (+ ``--pushgateway``). Exit 0 when the cycle finished (moves refused by a PDB
included), 1 when an API error or a replacement that never bound stopped it (the output says
what was done), 2 on bad flags or configuration (one line on stderr).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn
from urllib.parse import urlparse

import orjson
import structlog

from defrag.controller.cluster import read_cluster, read_dra, read_reservations
from defrag.controller.config import (
    DEFAULT_HYSTERESIS,
    OUTPUTS,
    DefragConfig,
    Limits,
    add_trigger_cycle_flags,
)
from defrag.controller.convergence import DefragState, convergence, parse_state
from defrag.controller.errors import CycleStopped
from defrag.controller.executor import (
    ClusterActions,
    DryRunActions,
    Executor,
    KubeActions,
    MigWriter,
)
from defrag.controller.ledger import StaleReservation, stale_reservations
from defrag.controller.metrics import CycleMetrics
from defrag.controller.migfacts import mig_facts
from defrag.controller.migplan import MigPlan, plan_dict, plan_lines, plan_mig
from defrag.controller.model import Snapshot
from defrag.controller.planner import plan as make_plan
from defrag.controller.prometheus import fetch_samples
from defrag.controller.report import plan_json, plan_table, result_json, rightsizing_lines
from defrag.controller.rightsize import RightsizingReport, publish
from defrag.controller.snapshot import UsageSource, build_snapshot, hold_reservations
from defrag.rightsizing.recommender import RightsizingConfig
from defrag.rightsizing.workloads import WorkloadClient
from gpufrag import diagnose, logs
from gpufrag.conventions import names_from_environ
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput
from scheduler.core.gpus import DEVICE_MODES, DRA_DEVICE_MODE
from scheduler.core.state import ClusterState
from scheduler.kube.client import api_client
from scheduler.kube.reservations import Reservation, reservation_from_k8s
from scheduler.policies import POLICY_NAMES, make_policy

PROG = "gpufrag defrag"
Obj = Mapping[str, Any]


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (exit 2), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: {message} (see --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def build_parser() -> argparse.ArgumentParser:
    d = DefragConfig()
    p = _Parser(prog=PROG, description=(
        "Run one defragmentation cycle: measure reserved-but-unused GPU memory and "
        "fragmentation, plan moves of small pods off triggered nodes (predicting each landing "
        "with the scheduler's own policy), print the plan, then evict through the Eviction API "
        "(PodDisruptionBudgets respected), steering each replacement with a placement hint."))
    k = p.add_argument_group("cluster")
    k.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then "
                                        "$KUBECONFIG or ~/.kube/config)")
    k.add_argument("--context", help="kubeconfig context")
    t = p.add_argument_group("trigger and measurement")
    t.add_argument("--threshold", type=float, default=d.threshold,
                   help="idle ratio above which a node is a source of moves (default: "
                        f"{d.threshold})")
    t.add_argument("--threshold-off", type=float, default=None,
                   help="hysteresis: a node triggered on idle memory stays triggered until "
                        "its idle ratio falls to this (default: --threshold minus "
                        f"{DEFAULT_HYSTERESIS:g})")
    add_trigger_cycle_flags(t)
    t.add_argument("--prometheus", metavar="URL",
                   help="read used GPU memory from DCGM_FI_DEV_FB_USED in this Prometheus "
                        "instead of the node agent's annotation")
    t.add_argument("--prometheus-interval-s", type=float, default=d.prometheus_interval_s,
                   help="DCGM scrape interval, for staleness (default: "
                        f"{d.prometheus_interval_s:g})")
    t.add_argument("--prometheus-peak-window-s", type=float,
                   default=d.prometheus_peak_window_s,
                   help="the window DCGM's peak use is read over (max_over_time), for the "
                        f"idle ratio (default: {d.prometheus_peak_window_s:g}, a day)")
    t.add_argument("--stale-intervals", type=float, default=d.stale_intervals,
                   help="ignore (and report) usage older than this many publishing intervals "
                        f"(default: {d.stale_intervals:g})")
    t.add_argument("--coverage", type=float, default=d.coverage,
                   help="FGD target workload: most popular pod specs covering this share "
                        f"(default: {d.coverage})")
    s = p.add_argument_group("what may move")
    s.add_argument("--max-evictions-per-node", type=int, default=d.limits.per_node,
                   help=f"default: {d.limits.per_node}")
    s.add_argument("--max-evictions-per-namespace", type=int, default=d.limits.per_namespace,
                   help=f"default: {d.limits.per_namespace}")
    s.add_argument("--max-evictions-total", type=int, default=d.limits.total,
                   help=f"default: {d.limits.total}")
    s.add_argument("--max-mig-relabels", type=int, default=d.max_mig_relabels,
                   help="the MIG step: set nvidia.com/mig.config on at most this many drained "
                        "MIG nodes whose layout the advisor would change (NVIDIA's MIG manager "
                        f"re-cuts them; 0: report only; default: {d.max_mig_relabels})")
    s.add_argument("--max-priority", type=int, default=d.max_priority,
                   help=f"never move pods with a higher priority (default: {d.max_priority})")
    s.add_argument("--max-pod-gpus", type=int, default=d.max_pod_gpus,
                   help="move GPU shares and pods of at most this many whole GPUs (default: "
                        f"{d.max_pod_gpus})")
    s.add_argument("--exclude-namespaces", default=",".join(sorted(d.excluded_namespaces)),
                   help="comma-separated namespaces never touched (default: "
                        f"{','.join(sorted(d.excluded_namespaces))})")
    s.add_argument("--namespaces", default="",
                   help="comma-separated: only pods in these namespaces may move (default: all)")
    s.add_argument("--policy", default=d.policy,
                   help=f"the scheduler's policy, to predict landings: one of "
                        f"{', '.join(n for n in POLICY_NAMES if n != 'random')} "
                        f"(default: {d.policy})")
    s.add_argument("--candidates-per-eviction", type=int, default=d.candidates_per_eviction,
                   help="candidate moves scored per allowed eviction (default: "
                        f"{d.candidates_per_eviction})")
    s.add_argument("--move-not-actionable", action="store_true",
                   help="also move pods off nodes triggered on idle memory that no "
                        "right-sizing reclaims (workloads in mode off or recommend, multi-GPU "
                        "pods): the moves then only cut fragmentation and free whole GPUs, "
                        "like a descheduler; default: such nodes are reported, not moved from")
    s.add_argument("--min-gain-gpus", type=float, default=d.min_gain_gpus,
                   help="plan a move only if it gives back at least this many GPUs "
                        f"(fragmentation, freed GPUs, idle reserved memory; default: "
                        f"{d.min_gain_gpus:g})")
    s.add_argument("--cooldown-s", type=float, default=d.cooldown_s,
                   help="an owner one of whose pods moved less than this long ago is not "
                        f"moved again (default: {d.cooldown_s:g}; 0: no cooldown)")
    s.add_argument("--node-cooldown-s", type=float, default=d.node_cooldown_s,
                   help="a node a move took a pod off less than this long ago is not a "
                        "target, and one a move landed a pod on is not a source: no node "
                        "flaps between giving and receiving (default: "
                        f"{d.node_cooldown_s:g}, a day; 0: none)")
    s.add_argument("--max-evictions-per-day-pct", type=float, default=None,
                   help="over any 24 hours, evict at most this share (%%) of the running GPU "
                        "pods (pods asking for a GPU, Running, not terminating); the "
                        "evictions are kept in the defrag state between runs (default: no "
                        "daily budget; e.g. 1)")
    r = p.add_argument_group("right-sizing (recommendations published on workloads' controllers)")
    rd = d.rightsizing
    r.add_argument("--rightsizing-percentile", type=float, default=rd.percentile,
                   help="recommend this percentile of the hourly peaks of GPU memory used "
                        f"(default: {rd.percentile})")
    r.add_argument("--rightsizing-headroom-fraction", type=float,
                   default=rd.headroom_fraction,
                   help=f"plus this fraction of it (default: {rd.headroom_fraction})")
    r.add_argument("--rightsizing-headroom-mib", type=int, default=rd.headroom_mib,
                   help=f"plus this much (default: {rd.headroom_mib})")
    r.add_argument("--rightsizing-min-mib", type=int, default=rd.min_mib,
                   help=f"never recommend less (default: {rd.min_mib})")
    r.add_argument("--rightsizing-window-s", type=float, default=rd.window_s,
                   help=f"history kept, in seconds (default: {rd.window_s:g}, 7 days)")
    r.add_argument("--rightsizing-whole-gpu-min-intervals", type=int,
                   default=rd.whole_gpu_min_intervals,
                   help="a pod asking one whole GPU, of a workload in auto mode, is admitted "
                        "as a share once its workload's history holds this many hourly peaks "
                        f"(default: {rd.whole_gpu_min_intervals}: a day)")
    r.add_argument("--rightsizing-oom-bump-fraction", type=float, default=rd.oom_bump_fraction,
                   help="a workload one of whose replicas used more than its share (or whose "
                        "right-sized container ran out of memory) is recommended at least "
                        "1 + this times that use (default: "
                        f"{rd.oom_bump_fraction:g}, VPA's 1.2)")
    r.add_argument("--rightsizing-oom-cooloff-s", type=float, default=rd.oom_cooloff_s,
                   help="... and its new pods are admitted as their template asks for this "
                        f"long (default: {rd.oom_cooloff_s:g}, a day)")
    a = p.add_argument_group("acting")
    a.add_argument("--dry-run", action="store_true",
                   help="print the plan and what would be done; write nothing")
    a.add_argument("--bind-timeout-s", type=float, default=d.bind_timeout_s,
                   help="wait this long for each replacement to be bound (default: "
                        f"{d.bind_timeout_s:g})")
    a.add_argument("--hint-ttl-s", type=float, default=d.hint_ttl_s,
                   help="placement hints and GPU reservations expire after this long (a "
                        "reservation's TTL counts from its pod's eviction; default: "
                        f"{d.hint_ttl_s:g})")
    a.add_argument("--orphan-grace-s", type=float, default=d.orphan_grace_s,
                   help="release a GPU reservation whose owner has no pod this long after it "
                        f"was made (default: {d.orphan_grace_s:g})")
    o = p.add_argument_group("output")
    o.add_argument("--output", default="table", help="table or json (JSON lines: the plan, "
                                                     "then the result)")
    o.add_argument("--pushgateway", metavar="URL",
                   help="push the cycle's metrics to this Prometheus Pushgateway")
    o.add_argument("--log-level", default=None, help="debug, info, warning, error")
    return p


def _url(value: str | None, flag: str, *, bare_host_ok: bool = False) -> None:
    if value is None:
        return
    parsed = urlparse(value if "://" in value or not bare_host_ok else f"http://{value}")
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise BadInput(f"{value!r} is not an http(s) URL; e.g. http://prometheus:9090",
                       field=flag)


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def config_from(args: argparse.Namespace) -> DefragConfig:
    if args.output not in OUTPUTS:
        raise BadInput(f"{args.output!r} is not one of {', '.join(OUTPUTS)}", field="--output")
    _url(args.prometheus, "--prometheus")
    _url(args.pushgateway, "--pushgateway", bare_host_ok=True)
    return DefragConfig(
        threshold=args.threshold, threshold_off=args.threshold_off,
        trigger_on_cycles=args.trigger_on_cycles, trigger_off_cycles=args.trigger_off_cycles,
        cooldown_s=args.cooldown_s, node_cooldown_s=args.node_cooldown_s,
        max_evictions_per_day_pct=args.max_evictions_per_day_pct,
        limits=Limits(per_node=args.max_evictions_per_node,
                      per_namespace=args.max_evictions_per_namespace,
                      total=args.max_evictions_total),
        max_priority=args.max_priority, max_pod_gpus=args.max_pod_gpus, policy=args.policy,
        max_mig_relabels=args.max_mig_relabels,
        coverage=args.coverage, stale_intervals=args.stale_intervals,
        prometheus_interval_s=args.prometheus_interval_s,
        prometheus_peak_window_s=args.prometheus_peak_window_s, bind_timeout_s=args.bind_timeout_s,
        hint_ttl_s=args.hint_ttl_s, orphan_grace_s=args.orphan_grace_s,
        candidates_per_eviction=args.candidates_per_eviction,
        min_gain_gpus=args.min_gain_gpus, move_not_actionable=args.move_not_actionable,
        excluded_namespaces=_names(args.exclude_namespaces),
        namespaces=_names(args.namespaces),
        dry_run=args.dry_run,
        rightsizing=RightsizingConfig(
            percentile=args.rightsizing_percentile,
            headroom_fraction=args.rightsizing_headroom_fraction,
            headroom_mib=args.rightsizing_headroom_mib, min_mib=args.rightsizing_min_mib,
            window_s=args.rightsizing_window_s,
            whole_gpu_min_intervals=args.rightsizing_whole_gpu_min_intervals,
            oom_bump_fraction=args.rightsizing_oom_bump_fraction,
            oom_cooloff_s=args.rightsizing_oom_cooloff_s),
        names=names_from_environ(),
    ).validate()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        config = config_from(args)
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else EXIT_BAD_INPUT
    logs.configure(args.log_level)
    diagnose.install("defrag")
    log = structlog.get_logger("defrag").bind(dry_run=config.dry_run)
    try:
        client = api_client(args.kubeconfig, args.context)
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return run_cycle(config, client, args, log)
    except CycleStopped as e:
        print(f"{PROG}: stopped before acting: {e}", file=sys.stderr)
        return EXIT_FAILURE


def _rightsizing_metrics(metrics: CycleMetrics, rightsizing: RightsizingReport) -> None:
    by_mode: dict[str, int] = {}
    for published in rightsizing.published:
        w = published.workload
        by_mode[published.mode.value] = by_mode.get(published.mode.value, 0) + 1
        for version, rec in published.recommendations.items():
            metrics.recommendation(namespace=w.namespace, kind=w.kind, workload=w.name,
                                   version=version, rec=rec)
    metrics.rightsizing(by_mode, len(rightsizing.rightsized), len(rightsizing.raised))


def _gpu_nodes(state: ClusterState) -> int:
    n = state.size
    return int((state.active[:n] & (state.gpu_count[:n] > 0)).sum())


def _releasable(stale: StaleReservation, config: DefragConfig) -> bool:
    """Whether this cycle deletes ``stale``: only reservations it made, and one whose owner
    is gone only when the owner's namespace is this cycle's to move pods in."""
    if not stale.managed:
        return False
    if stale.reason != "owner_gone":
        return True  # expired, unreadable or on a node that is gone: nobody's, anywhere
    if stale.namespace in config.excluded_namespaces:
        return False
    return not config.namespaces or stale.namespace in config.namespaces


def _live_reservations(objs: Sequence[Obj]) -> list[Reservation]:
    """The reservations that could be read (the unreadable ones are reported elsewhere)."""
    found = []
    for obj in objs:
        try:
            found.append(reservation_from_k8s(obj))
        except BadInput:
            continue
    return found


def plan_mig_step(config: DefragConfig, nodes: Sequence[Obj], pods: Sequence[Obj],
                  snapshot: Snapshot, reservations: Sequence[Obj], targets: frozenset[str],
                  now: float, log: structlog.typing.FilteringBoundLogger) -> MigPlan | None:
    """The MIG step's plan (None: the cluster has no MIG node)."""
    facts = mig_facts(nodes, pods, snapshot.readings, _live_reservations(reservations),
                      cordoned=snapshot.cordoned, now=now, names=config.names,
                      dynamic=frozenset(n for n, m in snapshot.mig.items() if m.dynamic))
    for problem in facts.problems:
        log.warning("object skipped", problem=problem)
    if not facts.nodes:
        return None
    return plan_mig(facts.nodes, facts.pending, max_relabels=config.max_mig_relabels,
                    targets=targets)


def run_cycle(config: DefragConfig, client: object, args: argparse.Namespace,
              log: structlog.typing.FilteringBoundLogger) -> int:
    """Read, plan, print, act, summarise. Raises CycleStopped if reading fails."""
    started = time.perf_counter()
    nodes, pods, pdbs = read_cluster(client)
    dra = read_dra(client)
    if dra.note:
        log.warning("DRA objects not read", reason=dra.note)
    dcgm = None
    if args.prometheus:
        dcgm = fetch_samples(args.prometheus, peak_window_s=config.prometheus_peak_window_s)
    source = UsageSource(stale_intervals=config.stale_intervals, now=time.time(), dcgm=dcgm,
                         dcgm_interval_s=config.prometheus_interval_s)
    snapshot, problems = build_snapshot(nodes, pods, pdbs, source, config.names, dra.claims,
                                        dra.slices)
    now = time.time()
    held = read_reservations(client, config.names.hints_namespace)
    if held is None:
        log.warning("no GPUReservation CRD: a cycle with moves will stop before evicting; "
                    "install manifests/base/crd-gpureservation.yaml")
    stale = stale_reservations(held or (), snapshot.pods, snapshot.state.index, now,
                               grace_s=config.orphan_grace_s)
    releasing = [s for s in stale if _releasable(s, config)]
    released = {s.name for s in releasing}
    problems += hold_reservations(
        snapshot, [o for o in held or () if (o.get("metadata") or {}).get("name") not in released],
        now)
    kube = KubeActions(client, log=log, names=config.names)
    try:
        previous = parse_state(kube.load_state())
    except BadInput as e:
        log.warning("defrag state unreadable: starting afresh", problem=str(e))
        previous = DefragState()
    previous.carry_into(snapshot, now, config)
    rightsizing = publish(snapshot, WorkloadClient(client), config.rightsizing, config.names,
                          now, dry_run=config.dry_run)
    snapshot.rightsized = rightsizing.rightsized
    snapshot.sizable = rightsizing.sizable
    for problem in rightsizing.problems:
        log.warning("right-sizing left a workload alone", problem=problem)
    for problem in problems:
        log.warning("object skipped", problem=problem)
    for note in snapshot.notes:
        log.warning("usage ignored", node=note.node, reason=note.reason)
    workload = snapshot.target_workload(config.coverage)
    policy = make_policy(config.policy, workload=workload)
    # Pods with claims are scored as the extender's DRA mode scores them (docs/dra.md).
    dra_policy = make_policy(config.policy, workload=workload,
                             device_choice=DEVICE_MODES[DRA_DEVICE_MODE][1])
    the_plan = make_plan(snapshot, policy, workload, config, dra_policy)
    log.info("plan made", moves=len(the_plan.moves), triggered=len(the_plan.triggered),
             scored=the_plan.scored, seconds=round(the_plan.seconds, 3))
    json_out = args.output == "json"
    render = plan_json if json_out else plan_table
    print(render(the_plan, snapshot.notes, dry_run=config.dry_run), flush=True)
    kept = [o for o in held or () if (o.get("metadata") or {}).get("name") not in released]
    mig_plan = plan_mig_step(config, nodes, pods, snapshot, kept,
                             frozenset(m.target for m in the_plan.moves), now, log)
    if mig_plan is not None:
        print(orjson.dumps(plan_dict(mig_plan, dry_run=config.dry_run)).decode() if json_out
              else "\n".join(plan_lines(mig_plan, dry_run=config.dry_run)), flush=True)

    metrics = CycleMetrics(dry_run=config.dry_run)
    metrics.planned(len(the_plan.moves), the_plan.seconds, len(the_plan.not_actionable))
    _rightsizing_metrics(metrics, rightsizing)
    dry = DryRunActions(log)
    actions: ClusterActions = dry if config.dry_run else kube
    mig_writer: MigWriter = dry if config.dry_run else kube
    metrics.stale(collections.Counter(s.reason for s in stale))
    for s in stale:
        log.warning("stale GPU reservation", reservation=s.name, reason=s.reason,
                    detail=s.detail, released=s.name in released)
        actions.report_stale(s, released=s.name in released, now=now)
    for s in releasing:  # a reservation only: deleting it never touches a pod
        actions.release(s.name)
        metrics.reservation("pruned")
    report = Executor(actions, config, metrics, log=log).run(the_plan, snapshot, workload)
    assert report.before is not None and report.after is not None
    if mig_plan is not None and report.error is None:
        try:
            for relabel in mig_plan.relabels:  # after the moves: the pods come first
                if mig_writer.relabel_mig(relabel, now):
                    metrics.mig_relabelled()
        except CycleStopped as e:
            report.error = str(e)
    summary = convergence(
        triggered_idle=len(report.latched_after), triggered_blocking=report.blocking_after,
        triggered=report.triggered_after, nodes=_gpu_nodes(snapshot.state),
        planned=len(the_plan.moves), evicted=report.evicted,
        cooling=the_plan.skipped.get("owner moved within --cooldown-s", 0),
        waiting=report.waiting_after)
    metrics.converged(settled=summary.settled, idle=summary.triggered_idle,
                      blocking=summary.triggered_blocking, any_=summary.triggered,
                      cooling=summary.cooling)
    if report.error is None or report.results:
        try:
            actions.save_state(previous.after_cycle(
                time.time(), config.cooldown_s, report.moved_owners,
                report.latched_after, report.streaks_after,
                node_cooldown_s=config.node_cooldown_s, moves=report.moved_nodes).encode())
        except CycleStopped as e:
            report.error = report.error or str(e)
    metrics.phase("before", report.before)
    metrics.phase("after", report.after)
    metrics.finished(time.perf_counter() - started)
    if json_out:
        print(result_json(report, dict(metrics.counts), dry_run=config.dry_run,
                          convergence=summary.as_dict(), rightsizing=rightsizing))
    else:
        for r in report.results:
            print(f"  {r.move.pod}: {r.outcome}"
                  + (f" on {r.landed_on} (planned {r.move.target})" if r.landed_on else ""))
        for move, why in report.skipped:
            print(f"  {move.pod}: skipped, {why}")
        print("\n".join(metrics.summary_lines(report.before, report.after)))
        print("\n".join(rightsizing_lines(rightsizing, dry_run=config.dry_run)))
        if report.stopped_early:
            print(f"stopped early: {report.stopped_early}")
        print(summary.line())
    if args.pushgateway:
        try:
            metrics.push(args.pushgateway)
        except Exception as e:  # a metrics side channel never fails a cycle that did its work
            log.warning("pushing metrics failed", pushgateway=args.pushgateway, error=str(e))
    if report.error is not None:
        print(f"{PROG}: cycle stopped: {report.error}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK
