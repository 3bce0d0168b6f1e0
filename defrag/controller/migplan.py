"""The MIG step of a defrag cycle: which drained MIG nodes should carry another MIG layout.

Static MIG (NVIDIA's device plugin, ``mixed`` strategy) serves a pod asking
``nvidia.com/mig-<profile>`` only from an instance of exactly that profile, so the layout a
node's GPUs carry decides what is stranded. NVIDIA's MIG manager re-cuts a node's GPUs when its
``nvidia.com/mig.config`` label names another config; defrag never touches a GPU itself, it
only sets that label, and only on a node nothing runs on (re-cutting stops every GPU client).

The rule, pure (the facts come from :mod:`defrag.controller.migfacts`):

1. Candidates: MIG nodes of a family the MIG table knows that are *drained* (no running pod
   asks a GPU resource there and the agent sees no pod or stray process on its GPUs), not
   cordoned (defrag never cordons, so a cordon is someone else's reason), not holding a live
   gpufrag reservation, not a target of this cycle's moves, and whose MIG manager is not
   still applying an earlier config (``nvidia.com/mig.config.state: pending``).
2. Demand per profile, per GPU family: what the pods bound to the family's nodes ask plus the
   family's share (by GPUs) of what pending pods ask (the advisor's window and pending; a
   one-cycle CronJob keeps no history, so the window is what runs now), less the instances
   the family's other MIG nodes offer: they keep their layout, and what they already serve
   needs no re-cut.
3. :func:`scheduler.core.mig_layout.advise_layouts` cuts the candidates for what is left; a
   candidate whose advised config differs from its label is relabelled, in node-name order,
   within ``--max-mig-relabels`` (a budget of its own: a relabel disrupts no pod, it takes a
   drained node's GPUs offline while they are re-cut). A node whose label already says the
   advice (or NVIDIA's ``all-<profile>`` for a one-profile advice) is left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.core.mig import MigGpuModel
from scheduler.core.mig_layout import MigLayout, advise_layouts

# NVIDIA's MIG manager reports on this label how applying the config went: pending while it
# re-cuts, then success or failed.
LABEL_MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
MIG_STATE_PENDING = "pending"


@dataclass(frozen=True, slots=True)
class MigNodeFacts:
    """What the MIG step needs of one MIG node (built by :mod:`defrag.controller.migfacts`)."""

    name: str
    model: MigGpuModel | None  # None: a product the MIG table does not cover
    gpus: int
    config: str = ""  # its nvidia.com/mig.config now ("": none)
    config_state: str = ""  # nvidia.com/mig.config.state
    offers: Mapping[str, int] = field(default_factory=dict)  # allocatable instances by profile
    asks: Mapping[str, int] = field(default_factory=dict)  # instances its bound pods ask
    busy: tuple[str, ...] = ()  # why it is not drained: pods (namespace/name) or the agent
    cordoned: bool = False
    reservations: tuple[str, ...] = ()  # live gpufrag reservations on it

    @property
    def drained(self) -> bool:
        return not self.busy


@dataclass(frozen=True, slots=True)
class Relabel:
    """One node's ``nvidia.com/mig.config`` to set: from ``current`` to ``config``."""

    node: str
    current: str
    config: str

    def message(self) -> str:
        """The sentence for people (the Node Event, the report line)."""
        was = f"from {self.current} " if self.current else ""
        return (f"drained MIG node: nvidia.com/mig.config set {was}to {self.config}, the layout "
                "gpufrag's advisor chose for the demand; NVIDIA's MIG manager re-cuts its GPUs")


@dataclass
class MigPlan:
    """The MIG step's answer: relabels within the budget, and every other drained MIG node
    with why it keeps its label."""

    relabels: list[Relabel] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (node, why)
    busy: int = 0  # MIG nodes something runs on (left alone, not listed)
    demand: dict[str, int] = field(default_factory=dict)  # running + pending, by profile


def _add(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for profile, n in counts.items():
        into[profile] = into.get(profile, 0) + n


def _same_layout(current: str, advised: MigLayout) -> bool:
    """Whether the config a node carries already cuts its GPUs as ``advised``: the same name,
    or NVIDIA's default ``all-<profile>`` for the advisor's one-profile layout (every GPU cut
    into as many instances of it as fit, which is the advisor's full layout of that profile)."""
    if current == advised.config_name:
        return True
    return len(advised.counts) == 1 and current == f"all-{advised.counts[0][0]}"


def _family_demand(model: MigGpuModel, members: Sequence[MigNodeFacts],
                   pending: Mapping[str, int], gpus_with: Mapping[str, int]) -> dict[str, float]:
    """A family's demand: what its nodes' pods ask, plus its share, by GPUs, of the pending
    asks for each profile it has (families that share a profile name share its queue)."""
    gpus = sum(n.gpus for n in members)
    demand: dict[str, float] = {}
    for node in members:
        for profile, n in node.asks.items():
            demand[profile] = demand.get(profile, 0.0) + n
    for profile, n in pending.items():
        if model.profile(profile) is not None and gpus_with.get(profile):
            demand[profile] = demand.get(profile, 0.0) + n * gpus / gpus_with[profile]
    return demand


def plan_mig(nodes: Iterable[MigNodeFacts], pending: Mapping[str, int], *, max_relabels: int,
             targets: frozenset[str] = frozenset()) -> MigPlan:
    """The relabels of one cycle (rule in the module docstring): ``pending`` counts the
    instances pods not bound yet ask; ``targets`` are the nodes this cycle's moves send pods
    to."""
    plan = MigPlan()
    by_family: dict[str, list[MigNodeFacts]] = {}
    models: dict[str, MigGpuModel] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        _add(plan.demand, node.asks)
        if node.model is None:
            if node.drained:
                plan.kept.append((node.name, "GPU product not in the MIG table"))
            continue
        models[node.model.family] = node.model
        by_family.setdefault(node.model.family, []).append(node)
    _add(plan.demand, pending)
    gpus_with: dict[str, int] = {}
    for family, members in by_family.items():
        for profile in models[family].profiles:
            gpus_with[profile.name] = gpus_with.get(profile.name, 0) + sum(
                n.gpus for n in members)
    left = max_relabels
    for family, members in sorted(by_family.items()):
        model = models[family]
        candidates = []
        others: dict[str, int] = {}
        for node in members:
            why = _not_a_candidate(node, targets)
            if why is None:
                candidates.append(node)
                continue
            _add(others, node.offers)
            if node.drained:
                plan.kept.append((node.name, why))
            else:
                plan.busy += 1
        if not candidates:
            continue
        demand = _family_demand(model, members, pending, gpus_with)
        wanted = {p: d - others.get(p, 0) for p, d in demand.items() if d > others.get(p, 0)}
        if not wanted:
            why = ("the demand is served by the other MIG nodes" if demand else
                   "no demand for its MIG profiles")
            plan.kept += [(node.name, why) for node in candidates]
            continue
        advice = advise_layouts(model, [(n.name, n.gpus) for n in candidates], wanted)
        for node in candidates:
            layout = advice.by_node[node.name]
            if _same_layout(node.config, layout):
                plan.kept.append((node.name, f"already carries the advised {layout.name} "
                                             f"({node.config})"))
            elif left <= 0:
                plan.kept.append((node.name, "--max-mig-relabels reached (advised "
                                             f"{layout.config_name})"))
            else:
                plan.relabels.append(Relabel(node.name, node.config, layout.config_name))
                left -= 1
    return plan


def _not_a_candidate(node: MigNodeFacts, targets: frozenset[str]) -> str | None:
    """Why a node of a known family is not relabelled this cycle, or None."""
    if node.busy:
        return "busy"
    if node.cordoned:
        return "cordoned (by someone else: defrag never cordons)"
    if node.reservations:
        return f"holds the GPU reservation {', '.join(sorted(node.reservations))}"
    if node.name in targets:
        return "a target of this cycle's moves"
    if node.config_state == MIG_STATE_PENDING:
        return "its MIG manager is still applying the last config"
    if node.gpus < 1:
        return "no GPU count (label nvidia.com/gpu.count)"
    return None


def plan_lines(plan: MigPlan, *, dry_run: bool) -> list[str]:
    """The MIG step's report lines (the table output)."""
    verb = "would set" if dry_run else "set"
    demand = ", ".join(f"{n} x {p}" for p, n in sorted(plan.demand.items())) or "none"
    lines = [f"MIG layouts: demand {demand}; {len(plan.relabels)} relabel(s), "
             f"{plan.busy} busy MIG node(s)"]
    lines += [f"  {r.node}: {verb} nvidia.com/mig.config={r.config}"
              + (f" (was {r.current})" if r.current else "") for r in plan.relabels]
    lines += [f"  {node}: kept, {why}" for node, why in plan.kept]
    return lines


def plan_dict(plan: MigPlan, *, dry_run: bool) -> dict[str, object]:
    """The MIG step as one JSON object (the json output's ``mig`` line)."""
    return {"kind": "mig", "dry_run": dry_run, "demand": dict(sorted(plan.demand.items())),
            "busy": plan.busy,
            "relabels": [{"node": r.node, "from": r.current, "to": r.config}
                         for r in plan.relabels],
            "kept": [{"node": node, "why": why} for node, why in plan.kept]}


__all__ = ["LABEL_MIG_CONFIG_STATE", "MigNodeFacts", "MigPlan", "Relabel", "plan_dict",
           "plan_lines", "plan_mig"]

