"""Cycles that converge: per-owner cooldown, trigger hysteresis, and whether the cluster settled.

Pure. A CronJob run forgets everything when it exits, so what one cycle must tell the next is
kept in one annotation (``names.annotation_defrag_state``) on the hints ConfigMap — an object
the controller already reads and writes, and whose ``data`` the extender reads (an annotation
there is invisible to it)::

    {"version": 1, "moved": {"<owner UID>": <unix seconds of the last move>, ...},
     "latched": ["<node>", ...], "streaks": {"<node>": <cycles in a row>, ...}}

- **cooldown**: a pod's replacement is a new pod of the same owner, so the cooldown is per owner
  (controller UID): an owner one of whose pods moved less than ``--cooldown-s`` ago is not moved
  again. Entries older than the cooldown are dropped when the state is written.
- **hysteresis**: a node's idle trigger turns on once it has been above ``--threshold`` for
  ``--trigger-on-cycles`` cycles in a row and, once on ("latched"), turns off only once it has
  been at or below ``--threshold-off`` for ``--trigger-off-cycles`` cycles in a row. The
  latched nodes are the ones the cycle ended with triggered on idle memory; ``streaks`` counts,
  per node, the cycles in a row towards its next change (absent: none; an older state without
  it reads as none).

An unreadable annotation is reported and read as empty (no cooldown, nothing latched): the worst
case is one cycle acting as the first one did.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gpufrag.errors import BadInput
from gpufrag.jsondoc import versioned_object

STATE_VERSION = 1


@dataclass(frozen=True)
class DefragState:
    """What the last cycles left for this one."""

    moved: Mapping[str, float] = field(default_factory=dict)  # owner UID -> last move (unix s)
    latched: frozenset[str] = frozenset()  # nodes whose idle trigger is on
    streaks: Mapping[str, int] = field(default_factory=dict)  # node -> cycles towards a change

    def cooling(self, now: float, cooldown_s: float) -> frozenset[str]:
        """Owners moved less than ``cooldown_s`` before ``now``."""
        return frozenset(o for o, t in self.moved.items() if now - t < cooldown_s)

    def after_cycle(self, now: float, cooldown_s: float, moved_owners: Iterable[str],
                    latched: Iterable[str],
                    streaks: Mapping[str, int] | None = None) -> DefragState:
        """The state to leave for the next cycle."""
        moved = {o: t for o, t in self.moved.items() if now - t < cooldown_s}
        moved.update({o: now for o in moved_owners if o})
        return DefragState(moved=moved, latched=frozenset(latched),
                           streaks=dict(streaks or {}))

    def encode(self) -> str:
        return orjson.dumps({"version": STATE_VERSION,
                             "moved": {k: round(v, 3) for k, v in sorted(self.moved.items())},
                             "latched": sorted(self.latched),
                             "streaks": dict(sorted(self.streaks.items()))}).decode()


def parse_state(text: str | None, *, source: str = "defrag state annotation") -> DefragState:
    """The state an annotation value holds (None = none yet); BadInput names what is wrong."""
    if not text:
        return DefragState()
    doc = versioned_object(text, STATE_VERSION, source=source)
    moved_raw = doc.get("moved", {})
    if not isinstance(moved_raw, dict):
        raise BadInput("expected an object", source=source, field="moved")
    moved: dict[str, float] = {}
    for owner, when in moved_raw.items():
        if (not isinstance(when, int | float) or isinstance(when, bool)
                or not math.isfinite(when)):
            raise BadInput(f"expected unix seconds, got {when!r}", source=source,
                           field=f"moved.{owner}")
        moved[str(owner)] = float(when)
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
    return DefragState(moved=moved, latched=frozenset(latched), streaks=streaks)


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
