"""Which MIG layout each node's GPUs should carry, given the demand for profiles.

Static MIG (NVIDIA's device plugin, ``mixed`` strategy) serves a pod asking
``nvidia.com/mig-<profile>`` only from an instance of exactly that profile, so a layout whose
instances nobody asks for strands its slices however well pods are placed. The advisor picks
layouts from the *full* layouts of a GPU family: every set of (profile, start) instances that
obeys the start rules of :mod:`scheduler.core.mig` (the one home of the geometry) and leaves no
free slice any profile could still start on. There are few (tens per family), so they are
enumerated once per family and cached; layouts with the same instance counts are one layout,
since NVIDIA's MIG manager takes counts, not positions.

The rule (greedy, documented in docs/mig.md):

1. Demand d_p per profile: the counts seen over a window plus the pending pods' profiles.
2. Target t_p = d_p x capacity / demand (both in slices): the demand's mix scaled to the
   capacity, so spare GPUs are cut in that mix rather than left whole, and a demand above
   capacity is served in its mix rather than by whichever profile comes first.
3. Nodes in order of GPU count (most first, then as given); each takes, for all its GPUs, the
   layout that serves the most not-yet-served target slices:
   gain = sum_p slices_p x (min(t_p, s_p + g x n_p) - min(t_p, s_p)), with s_p the instances
   given out so far, g the node's GPUs and n_p the layout's instances of p. Ties go to fewer
   idle slices, then to the family's layout order (largest instances first). A node is one
   layout (``devices: all``), as MIG manager configs usually are.

What the layouts strand: their slices in no instance plus those in instances beyond the
demand. With one profile demanded, every node takes the layout with the most instances of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from scheduler.core.mig import SLICES, MigGpuModel, placements

CONFIG_PREFIX = "gpufrag-"
MAX_LABEL_VALUE = 63  # a Kubernetes label value


@dataclass(frozen=True, slots=True)
class MigLayout:
    """One full layout of a GPU: its instances as (profile, start), and their counts."""

    instances: tuple[tuple[str, int], ...]  # by start
    counts: tuple[tuple[str, int], ...]  # the family's profile order, smallest first
    used_slices: int

    @property
    def name(self) -> str:
        """``1x3g.40gb-1x4g.40gb``: the counts, smallest profile first (a label-safe text)."""
        return "-".join(f"{n}x{p}" for p, n in self.counts)

    @property
    def config_name(self) -> str:
        """The mig-parted config name, the value of the ``nvidia.com/mig.config`` label."""
        return CONFIG_PREFIX + self.name

    def count(self, profile: str) -> int:
        return next((n for p, n in self.counts if p == profile), 0)


def _is_full(model: MigGpuModel, taken: int) -> bool:
    return not any(next(placements(p, taken), None) is not None for p in model.profiles)


@cache
def full_layouts(model: MigGpuModel) -> tuple[MigLayout, ...]:
    """Every full layout of ``model``'s GPU, one per distinct set of counts, largest instances
    first. A slice walk: at each free slice, start any profile allowed there or leave the slice
    empty; keep the sets no profile can be added to."""
    found: dict[tuple[tuple[str, int], ...], MigLayout] = {}
    order = {p.name: i for i, p in enumerate(model.profiles)}

    def walk(at: int, taken: int, chosen: tuple[tuple[str, int], ...]) -> None:
        if at == SLICES:
            if chosen and _is_full(model, taken):
                tally: dict[str, int] = {}
                for name, _ in chosen:
                    tally[name] = tally.get(name, 0) + 1
                counts = tuple(sorted(tally.items(), key=lambda kv: order[kv[0]]))
                found.setdefault(counts, MigLayout(chosen, counts, taken.bit_count()))
            return
        for profile in model.profiles:
            mask = profile.mask_at(at) if at + profile.slices <= SLICES else 0
            if mask and at in profile.starts and not mask & taken:
                walk(at + profile.slices, taken | mask, (*chosen, (profile.name, at)))
        walk(at + 1, taken, chosen)

    walk(0, 0, ())

    def largest_first(layout: MigLayout) -> tuple[int, ...]:
        return tuple(-layout.count(p.name) for p in reversed(model.profiles))

    return tuple(sorted(found.values(), key=largest_first))


@dataclass(frozen=True, slots=True)
class LayoutAdvice:
    """The advisor's answer: a layout per node, and what it leaves over."""

    family: str
    by_node: Mapping[str, MigLayout]
    served: Mapping[str, float]  # demanded instances the layouts can hold, per profile
    unserved: Mapping[str, float]  # demanded instances they cannot
    stranded_slices: int  # slices in no instance or in instances beyond the demand
    ignored: tuple[str, ...]  # demanded profiles the family does not have

    def labels(self) -> dict[str, str]:
        """The ``nvidia.com/mig.config`` value for each node."""
        return {node: layout.config_name for node, layout in self.by_node.items()}

    def mig_parted_config(self) -> str:
        """mig-parted's config file (the MIG manager's ConfigMap content) for these layouts."""
        return mig_parted_config(self.by_node.values())


def mig_parted_config(layouts: Iterable[MigLayout]) -> str:
    """``version: v1`` + ``mig-configs:``: ``all-disabled`` and one config per distinct layout,
    each ``devices: all``, ``mig-enabled: true`` and the layout's ``mig-devices`` counts. YAML
    written by hand (a fixed shape, every key quoted where it has a dot) so the core stays pure."""
    distinct = {layout.config_name: layout for layout in layouts}
    lines = ["version: v1", "mig-configs:", "  all-disabled:", "    - devices: all",
             "      mig-enabled: false"]
    for name in sorted(distinct):
        lines += [f"  {name}:", "    - devices: all", "      mig-enabled: true",
                  "      mig-devices:"]
        lines += [f'        "{profile}": {n}' for profile, n in distinct[name].counts]
    return "\n".join(lines) + "\n"


def advise_layouts(model: MigGpuModel, nodes: Sequence[tuple[str, int]],
                   window: Mapping[str, float], pending: Mapping[str, int] | None = None,
                   ) -> LayoutAdvice:
    """A layout for each of ``nodes`` (name, GPU count) of one family, by the greedy rule of
    the module docstring. ``window`` counts the profiles asked for over a window; ``pending``
    the profiles of pods waiting now (added to it). ValueError on a negative count, on no
    demand for any profile the family has, or on a node without GPUs."""
    demand: dict[str, float] = {}
    for source in (window, pending or {}):
        for name, n in source.items():
            if n < 0:
                raise ValueError(f"MIG demand for {name} is negative: {n}")
            demand[name] = demand.get(name, 0.0) + float(n)
    ignored = tuple(sorted(n for n, d in demand.items() if d > 0 and model.profile(n) is None))
    slices = {p.name: p.slices for p in model.profiles}
    demand = {n: d for n, d in demand.items() if n in slices and d > 0}
    if not demand:
        raise ValueError(f"no demand for any {model.family} MIG profile "
                         f"({', '.join(slices)})")
    bad = [name for name, g in nodes if g < 1]
    if bad:
        raise ValueError(f"nodes without GPUs cannot carry a MIG layout: {', '.join(bad)}")
    capacity = SLICES * sum(g for _, g in nodes)
    asked = sum(d * slices[n] for n, d in demand.items())
    scale = capacity / asked
    target = {n: d * scale for n, d in demand.items()}
    supply = dict.fromkeys(slices, 0)
    layouts = full_layouts(model)
    chosen: dict[str, MigLayout] = {}
    for name, g in sorted(nodes, key=lambda node: -node[1]):
        best, best_key = layouts[0], (float("-inf"), 0)
        for layout in layouts:
            gain = 0.0
            for profile, n in layout.counts:
                t = target.get(profile, 0.0)
                have = supply[profile]
                gain += slices[profile] * (min(t, have + g * n) - min(t, have))
            key = (gain, layout.used_slices)
            if key > best_key:
                best, best_key = layout, key
        chosen[name] = best
        for profile, n in best.counts:
            supply[profile] += g * n
    served = {n: min(d, float(supply[n])) for n, d in demand.items()}
    unserved = {n: d - served[n] for n, d in demand.items() if d > served[n]}
    useful = sum(slices[n] * served[n] for n in served)
    return LayoutAdvice(model.family, {name: chosen[name] for name, _ in nodes}, served,
                        unserved, round(capacity - useful), ignored)
