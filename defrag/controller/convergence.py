"""Cycles that converge: per-owner and per-node cooldowns, trigger hysteresis, the daily eviction
budget's memory, and whether the cluster settled.

Pure. A CronJob run forgets everything when it exits, so what one cycle must tell the next is
kept in one annotation (``names.annotation_defrag_state``) on the hints ConfigMap — an object
the controller already reads and writes, and whose ``data`` the extender reads (an annotation
there is invisible to it)::

    {"version": 1, "moved": {"<owner UID>": <unix seconds of the last move>, ...},
     "latched": ["<node>", ...], "streaks": {"<node>": <cycles in a row>, ...},
     "sources": {"<node>": <unix s>, ...}, "targets": {"<node>": <unix s>, ...},
     "evictions": [[<unix s>, <evictions>], ...]}

- **cooldown**: a pod's replacement is a new pod of the same owner, so the cooldown is per owner
  (controller UID): an owner one of whose pods moved less than ``--cooldown-s`` ago is not moved
  again. Entries older than the cooldown are dropped when the state is written.
- **hysteresis**: a node's idle trigger turns on once it has been above ``--threshold`` for
  ``--trigger-on-cycles`` cycles in a row and, once on ("latched"), turns off only once it has
  been at or below ``--threshold-off`` for ``--trigger-off-cycles`` cycles in a row. The
  latched nodes are the ones the cycle ended with triggered on idle memory; ``streaks`` counts,
  per node, the cycles in a row towards its next change (absent: none; an older state without
  it reads as none).
- **node cooldown**: per node, when it was last a move's source (``sources``) and last a move's
  target (``targets``). A node that gave a pod within ``--node-cooldown-s`` is not a target, and
  one that received a pod within it is not a source: each such move would undo part of another
  (the node flaps). Entries older than the node cooldown are dropped when the state is written.
- **daily eviction budget**: the controller's own evictions of the last 24 hours, as
  ``[cycle end, evictions]`` pairs (``--max-evictions-per-day-pct``,
  :mod:`defrag.controller.budget`); older pairs are dropped when the state is written.

Every key but ``version`` may be absent (an older state reads as none of it).

An unreadable annotation is reported and read as empty (no cooldown, nothing latched): the worst
case is one cycle acting as the first one did.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from defrag.controller.budget import DAY_S, EvictionLog, evictions_within
from defrag.controller.config import DefragConfig
from defrag.controller.model import Snapshot
from gpufrag.errors import BadInput
from gpufrag.jsondoc import versioned_object

STATE_VERSION = 1


@dataclass(frozen=True)
class DefragState:
    """What the last cycles left for this one."""

    moved: Mapping[str, float] = field(default_factory=dict)  # owner UID -> last move (unix s)
    latched: frozenset[str] = frozenset()  # nodes whose idle trigger is on
    streaks: Mapping[str, int] = field(default_factory=dict)  # node -> cycles towards a change
    sources: Mapping[str, float] = field(default_factory=dict)  # node -> last gave a pod (unix s)
    targets: Mapping[str, float] = field(default_factory=dict)  # node -> last received one
    evictions: EvictionLog = ()  # (cycle end, evictions) over the last day

    def cooling(self, now: float, cooldown_s: float) -> frozenset[str]:
        """Owners moved less than ``cooldown_s`` before ``now``."""
        return frozenset(o for o, t in self.moved.items() if now - t < cooldown_s)

    def recent_sources(self, now: float, node_cooldown_s: float) -> frozenset[str]:
        """Nodes a move took a pod off less than ``node_cooldown_s`` before ``now``."""
        return frozenset(n for n, t in self.sources.items() if now - t < node_cooldown_s)

    def recent_targets(self, now: float, node_cooldown_s: float) -> frozenset[str]:
        """Nodes a move landed a pod on less than ``node_cooldown_s`` before ``now``."""
        return frozenset(n for n, t in self.targets.items() if now - t < node_cooldown_s)

    def carry_into(self, snapshot: Snapshot, now: float, config: DefragConfig) -> None:
        """Tell this cycle's ``snapshot`` what the last cycles left: the latched nodes and
        their streaks, the owners and nodes in cooldown, the evictions of the last day."""
        snapshot.latched = self.latched
        snapshot.streaks = self.streaks
        snapshot.cooling = self.cooling(now, config.cooldown_s)
        snapshot.gave_recently = self.recent_sources(now, config.node_cooldown_s)
        snapshot.received_recently = self.recent_targets(now, config.node_cooldown_s)
        snapshot.evicted_last_day = evictions_within(self.evictions, now)

    def after_cycle(self, now: float, cooldown_s: float, moved_owners: Iterable[str],
                    latched: Iterable[str], streaks: Mapping[str, int] | None = None, *,
                    node_cooldown_s: float = 0.0,
                    moves: Iterable[tuple[str, str]] = ()) -> DefragState:
        """The state to leave for the next cycle; ``moves``: (source, target) of every pod
        evicted this cycle (they start the node cooldown and spend the daily budget)."""
        moved = {o: t for o, t in self.moved.items() if now - t < cooldown_s}
        moved.update({o: now for o in moved_owners if o})
        sources = {n: t for n, t in self.sources.items() if now - t < node_cooldown_s}
        targets = {n: t for n, t in self.targets.items() if now - t < node_cooldown_s}
        evicted = 0
        for source, target in moves:
            evicted += 1
            if node_cooldown_s > 0:
                sources[source] = targets[target] = now
        log = tuple((t, n) for t, n in self.evictions if now - t < DAY_S)
        if evicted:
            log += ((now, evicted),)
        return DefragState(moved=moved, latched=frozenset(latched),
                           streaks=dict(streaks or {}), sources=sources, targets=targets,
                           evictions=log)

    def encode(self) -> str:
        return orjson.dumps({"version": STATE_VERSION,
                             "moved": {k: round(v, 3) for k, v in sorted(self.moved.items())},
                             "latched": sorted(self.latched),
                             "streaks": dict(sorted(self.streaks.items())),
                             "sources": {k: round(v, 3) for k, v in sorted(self.sources.items())},
                             "targets": {k: round(v, 3) for k, v in sorted(self.targets.items())},
                             "evictions": [[round(t, 3), n] for t, n in self.evictions]}
                            ).decode()


def parse_state(text: str | None, *, source: str = "defrag state annotation") -> DefragState:
    """The state an annotation value holds (None = none yet); BadInput names what is wrong."""
    if not text:
        return DefragState()
    doc = versioned_object(text, STATE_VERSION, source=source)
    moved, sources, targets = (_times(doc, key, source) for key in ("moved", "sources",
                                                                      "targets"))
    latched = doc.get("latched", [])
    if not isinstance(latched, list) or not all(isinstance(n, str) for n in latched):
        raise BadInput("expected an array of node names", source=source, field="latched")
    streaks_raw = doc.get("streaks", {})
    if not isinstance(streaks_raw, dict):
        raise BadInput("expected an object", source=source, field="streaks")
    streaks: dict[str, int] = {}
    for node, count in streaks_raw.items():
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= 1000:
            raise BadInput(f"expected a count of cycles, got {count!r}", source=source,
                           field=f"streaks.{node}")
        streaks[str(node)] = count
    log_raw = doc.get("evictions", [])
    if not isinstance(log_raw, list):
        raise BadInput("expected an array of [unix seconds, evictions]", source=source,
                       field="evictions")
    log: list[tuple[float, int]] = []
    for i, entry in enumerate(log_raw):
        if not (isinstance(entry, list) and len(entry) == 2 and _is_time(entry[0])
                and isinstance(entry[1], int) and not isinstance(entry[1], bool)
                and entry[1] >= 0):
            raise BadInput(f"expected [unix seconds, evictions], got {entry!r}",
                           source=source, field=f"evictions[{i}]")
        log.append((float(entry[0]), entry[1]))
    return DefragState(moved=moved, latched=frozenset(latched), streaks=streaks,
                       sources=sources, targets=targets, evictions=tuple(log))


def _is_time(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _times(doc: Mapping[str, Any], key: str, source: str) -> dict[str, float]:
    """``doc[key]``: an object of name -> unix seconds (absent: empty)."""
    raw = doc.get(key, {})
    if not isinstance(raw, dict):
        raise BadInput("expected an object", source=source, field=key)
    out: dict[str, float] = {}
    for name, when in raw.items():
        if not _is_time(when):
            raise BadInput(f"expected unix seconds, got {when!r}", source=source,
                           field=f"{key}.{name}")
        out[str(name)] = float(when)
    return out


@dataclass(frozen=True, slots=True)
class Convergence:
    """The per-cycle summary: has the cluster settled?"""

    triggered: int  # nodes triggered at the end of the cycle
    triggered_idle: int
    triggered_blocking: int
    nodes: int  # nodes with GPUs
    planned: int
    evicted: int
    cooling: int  # owners still in cooldown (not movable this cycle)
    settled: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"triggered": self.triggered, "triggered_idle": self.triggered_idle,
                "triggered_blocking": self.triggered_blocking, "nodes": self.nodes,
                "planned": self.planned, "evicted": self.evicted, "cooling": self.cooling,
                "settled": self.settled, "why": self.why}

    def line(self) -> str:
        off = self.nodes - self.triggered
        share = f" ({off / self.nodes:.0%} off)" if self.nodes else ""
        return (f"convergence: {self.triggered} node(s) triggered ({self.triggered_idle} "
                f"idle, {self.triggered_blocking} blocking), {off} of {self.nodes} off{share}; "
                f"{self.planned} planned, {self.evicted} evicted, {self.cooling} owner(s) in "
                f"cooldown; settled: {'yes' if self.settled else 'no'} ({self.why})")


def convergence(*, triggered_idle: int, triggered_blocking: int, triggered: int, nodes: int,
                planned: int, evicted: int, cooling: int, waiting: int = 0) -> Convergence:
    """Settled = nothing left worth doing: no node triggered, or the plan had no move.
    ``waiting``: nodes above the threshold still counting cycles before they turn on
    (``--trigger-on-cycles``): while there are any, nothing has settled yet."""
    if waiting:
        settled, why = False, (f"{waiting} node(s) above the threshold, counting cycles "
                               "before they turn on")
    elif triggered == 0:
        settled, why = True, "no node is triggered"
    elif planned == 0:
        settled, why = True, ("no move improves the cluster"
                              + (f"; {cooling} owner(s) cooling down" if cooling else ""))
    else:
        settled, why = False, f"{evicted} pod(s) moved this cycle; the next may move more"
    return Convergence(triggered, triggered_idle, triggered_blocking, nodes, planned, evicted,
                       cooling, settled, why)
