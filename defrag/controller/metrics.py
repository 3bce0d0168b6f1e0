"""What one cycle did, counted: printed as a summary at the end and, with ``--pushgateway``,
pushed to a Prometheus Pushgateway (a CronJob lives too briefly to be scraped).

Metric names (all prefixed ``gpufrag_defrag_``):

- ``moves_planned`` — moves in the plan;
- ``evictions_total`` — pods evicted (in a dry run: that would have been);
- ``eviction_refusals_total{reason}`` — evictions the API server refused (``pdb``, ``gone``);
- ``failures_total{reason}`` — ``api_error``, ``bind_timeout``;
- ``landings_total{where}`` — replacements bound on the ``target`` or ``elsewhere``;
- ``skipped_total{reason}`` — planned moves not carried out (``trigger_cleared``);
- ``reservations_total{result}`` — GPU reservations ``created``, ``released`` (after the move,
  or for a move not carried out) and ``rolled_back`` (a plan that could not reserve it all);
- ``stale_reservations{reason}`` — reservations found holding capacity for nothing
  (``expired``, ``node_gone``, ``owner_gone``, ``unreadable``: defrag.controller.ledger); the
  ones this controller made are released (``reservations_total{result="pruned"}``);
- ``idle_ratio``, ``idle_bytes`` (reserved and not touched over the window: what the trigger
  reads), ``burst_headroom_bytes`` (peak over the window minus use now: reported, never a
  trigger), ``fragmentation_ratio``, ``free_whole_gpus`` ``{phase}`` — ``before`` the cycle
  and ``after`` it (the model, moved pods carrying their usage);
- ``mig_relabels_total`` — drained MIG nodes whose ``nvidia.com/mig.config`` was set (in a
  dry run: would have been; defrag.controller.migplan);
- ``cycle_seconds``, ``plan_seconds``, ``dry_run``.

Right-sizing (prefix ``gpufrag_rightsizing_``), one series per workload and model version
(labels ``namespace``, ``kind``, ``workload``, ``model_version``; ``*`` for pods without one):

- ``recommended_memory_bytes``, ``recommended_milli``, ``peak_memory_bytes`` — the
  recommendation published on the workload's controller, and the peak it may not go below;
- ``workloads{mode}`` — workloads with a recommendation, by mode;
- ``pods_rightsized`` — replicas whose replacement the webhook would admit with a smaller share.
"""

from __future__ import annotations

import collections

from prometheus_client import Counter, Gauge, push_to_gateway

from defrag.controller.measure import Summary, comparison_rows
from defrag.rightsizing.recommender import Mode, Recommendation
from gpufrag.metrics import new_registry

BYTES_PER_MIB = 1024**2
BYTES_PER_GIB = 1024**3  # Summary keeps GiB for people; Prometheus gets base units
PREFIX = "gpufrag_defrag_"
RS_PREFIX = "gpufrag_rightsizing_"
RS_LABELS = ("namespace", "kind", "workload", "model_version")
JOB = "gpufrag-defrag"


class CycleMetrics:
    def __init__(self, *, dry_run: bool) -> None:
        self.dry_run = dry_run
        self.registry = new_registry()
        r = self.registry
        # Counters start at zero in every run: one push is the whole story of one cycle.
        self._planned = Gauge(f"{PREFIX}moves_planned", "Moves in the plan", registry=r)
        self._evictions = Counter(f"{PREFIX}evictions", "Pods evicted", registry=r)
        self._refusals = Counter(f"{PREFIX}eviction_refusals",
                                 "Evictions refused by the API server", ["reason"], registry=r)
        self._failures = Counter(f"{PREFIX}failures", "Faults that stopped the cycle",
                                 ["reason"], registry=r)
        self._landings = Counter(f"{PREFIX}landings", "Replacements bound", ["where"],
                                 registry=r)
        self._skipped = Counter(f"{PREFIX}skipped", "Planned moves not carried out",
                                ["reason"], registry=r)
        self._reservations = Counter(f"{PREFIX}reservations", "GPU reservations, by result",
                                     ["result"], registry=r)
        self._mig_relabels = Counter(f"{PREFIX}mig_relabels",
                                     "Drained MIG nodes given a new nvidia.com/mig.config",
                                     registry=r)
        self._stale = Gauge(f"{PREFIX}stale_reservations",
                            "GPU reservations holding capacity nobody can use, by reason",
                            ["reason"], registry=r)
        self._phase = {
            name: Gauge(f"{PREFIX}{name}", text, ["phase"], registry=r)
            for name, text in (("idle_ratio", "GPU memory reserved and not touched over the "
                                              "window / reserved (the trigger's ratio)"),
                               ("idle_bytes", "GPU memory reserved and not touched over the "
                                              "window (allocated but unused)"),
                               ("burst_headroom_bytes", "GPU memory used at its peak over the "
                                                        "window but not now (never a trigger)"),
                               ("fragmentation_ratio", "FGD fragmentation / free GPU share"),
                               ("free_whole_gpus", "GPUs with nothing allocated"))
        }
        self._settled = Gauge(f"{PREFIX}settled", "1 when the cycle found nothing left to do",
                              registry=r)
        self._triggered = Gauge(f"{PREFIX}triggered_nodes",
                                "Nodes triggered at the end of the cycle", ["trigger"], registry=r)
        self._cooling = Gauge(f"{PREFIX}owners_in_cooldown",
                              "Owners not moved this cycle: moved within --cooldown-s",
                              registry=r)
        self._rs = {
            name: Gauge(f"{RS_PREFIX}{name}", text, RS_LABELS, registry=r)
            for name, text in (("recommended_memory_bytes", "Recommended GPU memory per replica"),
                               ("recommended_milli", "Recommended GPU share per replica"),
                               ("peak_memory_bytes", "Largest GPU memory used in the window"))
        }
        self._rs_workloads = Gauge(f"{RS_PREFIX}workloads", "Workloads with a recommendation",
                                   ["mode"], registry=r)
        for mode in Mode:
            self._rs_workloads.labels(mode.value)
        self._rs_pods = Gauge(f"{RS_PREFIX}pods_rightsized",
                              "Replicas whose replacement gets a smaller share", registry=r)
        self._rs_raised = Gauge(f"{RS_PREFIX}raised",
                                "Workload versions the guard raised this cycle (a replica "
                                "over its share or out of memory)", registry=r)
        self._not_actionable = Gauge(f"{PREFIX}nodes_not_actionable",
                                     "Nodes triggered on idle memory no right-sizing reclaims",
                                     registry=r)
        self._cycle_s = Gauge(f"{PREFIX}cycle_seconds", "Wall time of the cycle", registry=r)
        self._plan_s = Gauge(f"{PREFIX}plan_seconds", "Time spent planning", registry=r)
        Gauge(f"{PREFIX}dry_run", "1 when nothing was written", registry=r).set(int(dry_run))
        self.counts: collections.Counter[str] = collections.Counter()

    def planned(self, moves: int, seconds: float, not_actionable: int = 0) -> None:
        self._planned.set(moves)
        self._not_actionable.set(not_actionable)
        self._plan_s.set(seconds)
        self.counts["planned"] = moves

    def evicted(self) -> None:
        self._evictions.inc()
        self.counts["evicted"] += 1

    def refused(self, reason: str) -> None:
        self._refusals.labels(reason).inc()
        self.counts[f"refused ({reason})"] += 1

    def failed(self, reason: str) -> None:
        self._failures.labels(reason).inc()
        self.counts[f"failed ({reason})"] += 1

    def landed(self, on_target: bool) -> None:
        where = "target" if on_target else "elsewhere"
        self._landings.labels(where).inc()
        self.counts[f"landed on {where}"] += 1

    def skipped(self, reason: str) -> None:
        self._skipped.labels(reason).inc()
        self.counts[f"skipped ({reason})"] += 1

    def mig_relabelled(self) -> None:
        self._mig_relabels.inc()
        self.counts["MIG nodes relabelled"] += 1

    def reservation(self, result: str) -> None:
        self._reservations.labels(result).inc()
        self.counts[f"reservations {result}"] += 1

    def stale(self, counts: collections.Counter[str]) -> None:
        for reason, count in counts.items():
            self._stale.labels(reason).set(count)
            self.counts[f"stale reservations ({reason})"] += count

    def recommendation(self, *, namespace: str, kind: str, workload: str, version: str,
                       rec: Recommendation) -> None:
        labels = (namespace, kind, workload, version)
        self._rs["recommended_memory_bytes"].labels(*labels).set(rec.memory_mib * BYTES_PER_MIB)
        self._rs["recommended_milli"].labels(*labels).set(rec.milli)
        self._rs["peak_memory_bytes"].labels(*labels).set(rec.peak_mib * BYTES_PER_MIB)

    def rightsizing(self, workloads_by_mode: dict[str, int], pods_rightsized: int,
                    raised: int = 0) -> None:
        for mode, count in workloads_by_mode.items():
            self._rs_workloads.labels(mode).set(count)
        self._rs_pods.set(pods_rightsized)
        self._rs_raised.set(raised)
        self.counts["workloads raised by the guard"] = raised
        self.counts["recommendations published"] = sum(workloads_by_mode.values())

    def phase(self, phase: str, summary: Summary) -> None:
        self._phase["idle_ratio"].labels(phase).set(summary.idle_ratio)
        self._phase["idle_bytes"].labels(phase).set(summary.idle_gib * BYTES_PER_GIB)
        self._phase["burst_headroom_bytes"].labels(phase).set(
            summary.burst_headroom_gib * BYTES_PER_GIB)
        self._phase["fragmentation_ratio"].labels(phase).set(summary.frag_ratio)
        self._phase["free_whole_gpus"].labels(phase).set(summary.free_whole_gpus)

    def converged(self, *, settled: bool, idle: int, blocking: int, any_: int,
                  cooling: int) -> None:
        self._settled.set(int(settled))
        self._triggered.labels(trigger="idle").set(idle)
        self._triggered.labels(trigger="blocking").set(blocking)
        self._triggered.labels(trigger="any").set(any_)
        self._cooling.set(cooling)

    def finished(self, seconds: float) -> None:
        self._cycle_s.set(seconds)

    def push(self, url: str, *, timeout_s: float = 10.0) -> None:
        """Push everything under job ``gpufrag-defrag``; raises OSError-like errors to the
        caller, which reports them without failing a cycle that did its work."""
        push_to_gateway(url, job=JOB, registry=self.registry, timeout=timeout_s)

    def summary_lines(self, before: Summary, after: Summary) -> list[str]:
        mode = "dry run: nothing was written" if self.dry_run else "live"
        lines = [f"defrag cycle summary ({mode})"]
        rest = sorted(k for k in self.counts if k not in ("planned", "evicted"))
        keys = ["planned", "evicted", *rest]
        lines += [f"  {k:<36}{self.counts.get(k, 0):>10}" for k in keys]
        lines.append(f"  {'':<36}{'before':>10}{'after':>10}")
        for label, b, a in comparison_rows(before, after):
            lines.append(f"  {label:<36}{b:>10}{a:>10}")
        return lines
