"""MIG: which instances a GPU can hold where, and FGD's fragmentation over what stays free.

A MIG-capable GPU is cut into eight memory slices. A GPU instance profile (``1g.10gb``,
``3g.40gb``, ...) takes a fixed number of consecutive slices and may only *start* at certain
slices (NVIDIA's placement rules: ``nvidia-smi mig -lgipp``, NVML's
``nvmlDeviceGetGpuInstancePossiblePlacements``). Free slices that do not line up with a
profile's allowed starts are lost to that profile: this is where fragmentation bites hardest,
and why the measure here is FGD's (DESIGN.md, "Fragmentation, precisely") carried over from
per-GPU shares to slice positions:

- for one target profile m, the fragment of a GPU is every free slice no legal placement of m
  inside the free slices covers (all free slices when m fits nowhere on it);
- F(gpu) = sum over the target workload's profiles of popularity x fragment, in milli-GPU
  (one slice = 1000 / 8 milli), so it adds up with the rest of the placement core;
- a pod asking a profile goes where, among the legal (GPU, start) positions, F grows least.

Pure stdlib: one GPU's state is an 8-bit mask of taken slices, so every question here is a
few bit operations. The profile tables are the one home for MIG geometry; their source is
NVIDIA's MIG user guide ("Supported MIG Profiles"), the same placements ``nvidia-smi mig
-lgipp`` lists. Only the profiles with one GPU instance per compute instance are modelled (the
``+me`` media variants share their base profile's placements and are left out).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache

from scheduler.core.types import MILLI_PER_GPU

SLICES = 8  # memory slices of every MIG-capable GPU in the table
MILLI_PER_SLICE = MILLI_PER_GPU // SLICES  # 125
ALL_FREE = (1 << SLICES) - 1


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU instance profile: ``slices`` consecutive memory slices from one of ``starts``."""

    name: str  # as the NVIDIA device plugin's resource has it: nvidia.com/mig-<name>
    compute: int  # compute slices (the "Ng" of the name)
    slices: int
    starts: tuple[int, ...]
    memory_mib: int

    def __post_init__(self) -> None:
        if not 1 <= self.slices <= SLICES or not self.starts:
            raise ValueError(f"MIG profile {self.name}: bad size {self.slices} or no start")
        if any(s < 0 or s + self.slices > SLICES for s in self.starts):
            raise ValueError(f"MIG profile {self.name}: a start puts it past slice {SLICES}")

    def mask_at(self, start: int) -> int:
        """The slices an instance of this profile started at ``start`` takes, as a bit mask."""
        return ((1 << self.slices) - 1) << start

    @property
    def milli(self) -> int:
        """The share of the GPU this profile takes, in milli-GPU."""
        return self.slices * MILLI_PER_SLICE


@dataclass(frozen=True, slots=True)
class MigGpuModel:
    """A MIG-capable GPU: its profiles, smallest first."""

    family: str
    memory_mib: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def smallest_fitting(self, memory_mib: int) -> MigProfile | None:
        """The smallest profile with at least ``memory_mib`` of GPU memory (None: none has)."""
        return next((p for p in self.profiles if p.memory_mib >= memory_mib), None)


def _model(family: str, memory_gb: int, names: tuple[str, str, str, str, str, str]) -> MigGpuModel:
    """One family's six profiles. Every MIG-capable GPU in the table shares one geometry
    (NVIDIA's MIG user guide): 1g with one slice at any start 0-6; 1g with two slices and 2g at
    even starts (1g: 0, 2, 4, 6; 2g: 0, 2, 4); 3g at 0 or 4; 4g at 0; 7g the whole GPU. Memory
    is the profile's slices of the GPU's (the name's figure, rounded by NVIDIA)."""
    per_slice = memory_gb * 1024 // SLICES
    shapes = ((1, 1, (0, 1, 2, 3, 4, 5, 6)), (1, 2, (0, 2, 4, 6)), (2, 2, (0, 2, 4)),
              (3, 4, (0, 4)), (4, 4, (0,)), (7, 8, (0,)))
    profiles = tuple(MigProfile(name, compute, slices, starts, slices * per_slice)
                     for name, (compute, slices, starts) in zip(names, shapes, strict=True))
    return MigGpuModel(family, memory_gb * 1024, profiles)


MIG_MODELS: Mapping[str, MigGpuModel] = {m.family: m for m in (
    _model("A100-40GB", 40, ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")),
    _model("A100-80GB", 80, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    _model("H100-80GB", 80, ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")),
    _model("H200-141GB", 141, ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb",
                               "7g.141gb")),
)}

_PROFILE_NAME = re.compile(r"^(\d)g\.(\d+)gb$")


def mig_model(product: str, gpu_memory_mib: int = 0) -> MigGpuModel | None:
    """The MIG model of a GPU product as GPU feature discovery names it
    (``NVIDIA-A100-SXM4-40GB``, ``NVIDIA-H100-80GB-HBM3``, ``NVIDIA-H200``), told apart by
    its memory where the name does not say; None for a product the table does not cover."""
    text = product.upper()
    if "A100" in text:
        big = "80GB" in text or gpu_memory_mib > 48 * 1024
        return MIG_MODELS["A100-80GB" if big else "A100-40GB"]
    if "H100" in text and ("80GB" in text or 70 * 1024 < gpu_memory_mib <= 82 * 1024):
        return MIG_MODELS["H100-80GB"]
    if "H200" in text:
        return MIG_MODELS["H200-141GB"]
    return None


def is_profile_name(name: str) -> bool:
    """Whether ``name`` reads as a MIG profile (``3g.40gb``), whatever the GPU."""
    return _PROFILE_NAME.match(name) is not None


# ------------------------------------------------------------------------------ placement

def placements(profile: MigProfile, taken: int) -> Iterator[int]:
    """Every legal start of ``profile`` on a GPU whose taken slices are the mask ``taken``."""
    for start in profile.starts:
        if not profile.mask_at(start) & taken:
            yield start


def most_per_gpu(name: str) -> int:
    """The most instances of the profile ``name`` one GPU of the table holds, over the
    families that have the name (``1g.10gb``: seven on an A100 80GB, four on an A100 40GB);
    0 for a name no family has. What bounds a count of them one node can serve. Placing each
    at its lowest free start is the most: the profile's placements are equal in length."""
    most = 0
    for model in MIG_MODELS.values():
        profile = model.profile(name)
        if profile is None:
            continue
        taken = held = 0
        while (start := next(placements(profile, taken), None)) is not None:
            taken |= profile.mask_at(start)
            held += 1
        most = max(most, held)
    return most


def covered(profile: MigProfile, taken: int) -> int:
    """The free slices some legal placement of ``profile`` would use, as a mask."""
    mask = 0
    for start in placements(profile, taken):
        mask |= profile.mask_at(start)
    return mask


@dataclass(frozen=True, slots=True)
class MigWorkload:
    """Target profiles with their popularities (summing to 1): the MIG counterpart of
    :class:`~scheduler.core.fragmentation.TargetWorkload`, by profile name so one workload
    serves every GPU family that has the profile."""

    popularity: Mapping[str, float]

    def __post_init__(self) -> None:
        if not self.popularity:
            raise ValueError("MigWorkload needs at least one profile")
        if any(p < 0 for p in self.popularity.values()):
            raise ValueError("MigWorkload: popularities must be >= 0")
        if abs(sum(self.popularity.values()) - 1.0) > 1e-9:
            raise ValueError("MigWorkload: popularities must sum to 1")
        unknown = [n for n in self.popularity if not is_profile_name(n)]
        if unknown:
            raise ValueError(f"MigWorkload: not MIG profile names: {', '.join(unknown)}")

    @classmethod
    def from_counts(cls, counts: Iterable[tuple[str, float]]) -> MigWorkload:
        items = [(name, float(n)) for name, n in counts if n > 0]
        total = sum(n for _, n in items)
        if total <= 0:
            raise ValueError("MigWorkload needs profiles with positive counts")
        merged: dict[str, float] = {}
        for name, n in items:
            merged[name] = merged.get(name, 0.0) + n / total
        return cls(merged)


def fragment_slices(profile: MigProfile | None, taken: int) -> int:
    """For one target profile, the free slices it can never use on this GPU as it is: those no
    legal placement covers, or every free slice when it fits nowhere (or the GPU lacks it)."""
    free = ALL_FREE & ~taken
    if profile is None:
        return free.bit_count()
    return (free & ~covered(profile, taken)).bit_count()


def gpu_fragmentation(model: MigGpuModel, taken: int, workload: MigWorkload) -> float:
    """F of one MIG GPU in milli-GPU: the expected free share a task drawn from ``workload``
    cannot use there (a profile this GPU does not have loses all of it)."""
    total = 0.0
    for name, popularity in workload.popularity.items():
        total += popularity * fragment_slices(model.profile(name), taken) * MILLI_PER_SLICE
    return total


@dataclass(frozen=True, slots=True)
class MigChoice:
    """Where an instance goes on one node: the GPU, its start slice, and F's growth there."""

    gpu: int
    start: int
    delta_milli: float


def best_placement(model: MigGpuModel, taken_by_gpu: Iterable[int], profile: MigProfile,
                   workload: MigWorkload) -> MigChoice | None:
    """FGD over MIG on one node: the legal (GPU, start) where F grows least, ties to the lowest
    GPU and then the lowest start (a fixed order, as the scheduler's ties are); None when the
    profile fits on no GPU of the node."""
    best: MigChoice | None = None
    for gpu, taken in enumerate(taken_by_gpu):
        before = gpu_fragmentation(model, taken, workload)
        for start in placements(profile, taken):
            after = gpu_fragmentation(model, taken | profile.mask_at(start), workload)
            delta = after - before
            if best is None or delta < best.delta_milli:
                best = MigChoice(gpu, start, delta)
    return best


def taken_mask(model: MigGpuModel, instances: Iterable[tuple[str, int]]) -> int:
    """The taken-slice mask of a GPU holding ``instances`` as (profile name, start) pairs;
    ValueError naming the first one that is unknown, misplaced or overlapping."""
    taken = 0
    for name, start in instances:
        profile = model.profile(name)
        if profile is None:
            raise ValueError(f"{model.family} has no MIG profile {name!r}")
        if start not in profile.starts:
            raise ValueError(f"MIG {name} cannot start at slice {start} on {model.family} "
                             f"(starts: {', '.join(map(str, profile.starts))})")
        mask = profile.mask_at(start)
        if mask & taken:
            raise ValueError(f"MIG {name} at slice {start} overlaps another instance")
        taken |= mask
    return taken


def free_slices(taken: int) -> int:
    """How many of the GPU's slices are free."""
    return (ALL_FREE & ~taken).bit_count()


# ------------------------------------------------------------------ nodes in static MIG
# What the extender needs of a node whose GPUs are cut (NVIDIA's device plugin, ``mixed``
# strategy): where each instance sits, which are in use, and where a pod asking a profile
# strands least. The Kubernetes side (which source says what) is scheduler.kube.mignodes.

@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance of a node: its GPU, profile, start slice, and whether a pod holds it."""

    gpu: int
    profile: str
    start: int
    in_use: bool = False


PACK_STEPS = 20_000  # the packing's search budget, in placements tried (a few ms)


def pack_instances(model: MigGpuModel, counts: Mapping[str, int], gpus: int,
                   ) -> tuple[tuple[MigInstance, ...], dict[str, int]]:
    """Legal positions for ``counts`` instances (profile name -> number) on ``gpus`` GPUs,
    and the instances of each profile that found none (or that ``model`` does not have).

    Deterministic: largest profiles first (among equal sizes the one with fewer starts: 4g
    before 3g), each at the lowest GPU and then the lowest legal start that still lets every
    later instance find a place (a depth-first search, GPUs with equal taken slices tried
    once, within :data:`PACK_STEPS`); where no such packing is found, first fit, leaving over
    what fits nowhere. It is an approximation: NVIDIA's MIG manager creates instances from
    counts and lets NVML choose their positions, so only the agent's reading gives the real
    ones. Every position it gives is legal and none overlap, and the counts of any full layout
    repeated over the GPUs are placed whole (``tests/scheduler/core/test_mig.py``)."""
    left: dict[str, int] = {name: n for name, n in counts.items()
                            if n > 0 and model.profile(name) is None}
    items = [p for p in reversed(model.profiles) for _ in range(max(counts.get(p.name, 0), 0))]
    spots = _replicated(model, counts, gpus) or _search(items, gpus)
    if spots is None:  # no packing of all of them found: first fit, the rest left over
        taken = [0] * gpus
        spots = []
        for profile in items:
            spot = next(((g, s) for g in range(gpus) for s in placements(profile, taken[g])),
                        None)
            spots.append(spot)
            if spot is not None:
                taken[spot[0]] |= profile.mask_at(spot[1])
    found: list[MigInstance] = []
    for profile, spot in zip(items, spots, strict=True):
        if spot is None:
            left[profile.name] = left.get(profile.name, 0) + 1
        else:
            found.append(MigInstance(spot[0], profile.name, spot[1]))
    found.sort(key=lambda i: (i.gpu, i.start))
    return tuple(found), left


def _replicated(model: MigGpuModel, counts: Mapping[str, int],
                gpus: int) -> list[tuple[int, int] | None] | None:
    """The usual case first: counts that split evenly over the GPUs, as a MIG manager config
    with ``devices: all`` gives, packed on one GPU and repeated (in the order of ``items`` in
    :func:`pack_instances`); None when they do not split or one GPU's share does not fit."""
    if gpus < 1 or any(n % gpus for n in counts.values() if n > 0):
        return None
    one = [p for p in reversed(model.profiles)
           for _ in range(max(counts.get(p.name, 0), 0) // gpus)]
    spots = _search(one, 1)
    if spots is None:
        return None
    return [(g, spot[1]) for spot in spots if spot is not None for g in range(gpus)]


def _search(items: Sequence[MigProfile], gpus: int) -> list[tuple[int, int] | None] | None:
    """A (GPU, start) for every item, the first in (GPU, start) order that places all of them;
    None when there is none or the budget ran out."""
    taken = [0] * gpus
    spots: list[tuple[int, int] | None] = []
    steps = 0

    def walk(i: int) -> bool:
        nonlocal steps
        if i == len(items):
            return True
        steps += 1
        if steps > PACK_STEPS:
            return False
        profile = items[i]
        # Instances of one profile are alike: each goes after the one before (no orderings
        # of the same set are tried twice).
        after = spots[-1] if i and items[i - 1] is profile else None
        tried: set[int] = set()
        for g in range(after[0] if after else 0, gpus):
            if taken[g] in tried:  # a GPU like one tried already: the same outcome
                continue
            if after is None or g != after[0]:  # (that one was tried past ``after`` only)
                tried.add(taken[g])
            for start in placements(profile, taken[g]):
                if after is not None and (g, start) <= after:
                    continue
                mask = profile.mask_at(start)
                taken[g] |= mask
                spots.append((g, start))
                if walk(i + 1):
                    return True
                taken[g] &= ~mask
                spots.pop()
        return False

    return spots if walk(0) else None


def mark_in_use(instances: Iterable[MigInstance], used: Mapping[str, int]
                ) -> tuple[MigInstance, ...]:
    """``instances`` with ``used[profile]`` of each profile marked in use, the first ones in
    (GPU, start) order: what is known when only counts are (which instance the device plugin
    handed each pod is not published)."""
    left = dict(used)
    out: list[MigInstance] = []
    for instance in instances:
        take = left.get(instance.profile, 0) > 0
        if take:
            left[instance.profile] -= 1
        out.append(MigInstance(instance.gpu, instance.profile, instance.start, take))
    return tuple(out)


@cache
def profiles_by_name(model: MigGpuModel) -> Mapping[str, MigProfile]:
    """``model``'s profiles by name (one lookup where ``MigGpuModel.profile`` walks them)."""
    return {p.name: p for p in model.profiles}


def fragmentation_table(model: MigGpuModel, workload: MigWorkload) -> tuple[float, ...]:
    """F (:func:`gpu_fragmentation`) of a GPU of ``model`` for every taken mask, by mask: a
    GPU has eight slices, so 256 values answer every question about ``workload`` there (a
    caller scoring many nodes keeps one per family and workload)."""
    return tuple(gpu_fragmentation(model, taken, workload) for taken in range(ALL_FREE + 1))


def used_masks(model: MigGpuModel, instances: Iterable[MigInstance]) -> dict[int, int]:
    """GPU -> the slices its in-use instances take (free instances count as free slices: the
    layout advisor may cut them again); every GPU with an instance has an entry."""
    masks: dict[int, int] = {}
    by_name = profiles_by_name(model)
    for instance in instances:
        profile = by_name.get(instance.profile)
        mask = masks.setdefault(instance.gpu, 0)
        if instance.in_use and profile is not None:
            masks[instance.gpu] = mask | profile.mask_at(instance.start)
    return masks


@dataclass(frozen=True, slots=True)
class MigFit:
    """Where a pod's instances go on one node (each a free instance of the asked profile) and
    how much F grows over the node's GPUs for them, in milli-GPU."""

    chosen: tuple[MigInstance, ...]
    delta_milli: float


def best_instances(model: MigGpuModel, instances: Sequence[MigInstance],
                   ask: Mapping[str, int], workload: MigWorkload,
                   table: Sequence[float] | None = None) -> MigFit | None:
    """FGD over a node's free instances: for each instance asked (largest profiles first), the
    free instance of that profile where F of its GPU grows least given the slices in use
    (ties to the lowest GPU, then the lowest start), taken before the next is chosen. None
    when the node lacks a free instance for the ask; the NVIDIA device plugin picks the
    instance itself, so this is the best the node offers, not a promise of which it gives.
    ``table``: ``fragmentation_table(model, workload)``, when the caller keeps one."""
    masks = used_masks(model, instances)
    by_name = profiles_by_name(model)
    frag = table if table is not None else fragmentation_table(model, workload)
    free = [i for i in instances if not i.in_use and i.profile in by_name]
    order = {p.name: -p.slices for p in model.profiles}
    chosen: list[MigInstance] = []
    delta = 0.0
    for name in sorted(ask, key=lambda n: (order.get(n, 0), n)):
        profile = by_name.get(name)
        for _ in range(ask[name]):
            best: tuple[float, int, int, int] | None = None
            for k, instance in enumerate(free):
                if (instance.profile != name or profile is None
                        or instance.start not in profile.starts):
                    continue  # (an instance at a start NVML never gives is not one to use)
                taken = masks[instance.gpu]
                if taken & profile.mask_at(instance.start):
                    continue  # overlaps one in use or just chosen (free DRA placements do)
                grow = frag[taken | profile.mask_at(instance.start)] - frag[taken]
                key = (grow, instance.gpu, instance.start, k)
                if best is None or key < best:
                    best = key
            if best is None or profile is None:
                return None
            picked = free.pop(best[3])
            masks[picked.gpu] |= profile.mask_at(picked.start)
            chosen.append(MigInstance(picked.gpu, picked.profile, picked.start, True))
            delta += best[0]
    return MigFit(tuple(chosen), delta)


def default_workload(model: MigGpuModel) -> MigWorkload:
    """The target workload before any pod asking a MIG profile is seen: every profile of the
    family equally popular (as the whole-GPU fallback spreads the common shapes evenly)."""
    return MigWorkload.from_counts((p.name, 1) for p in model.profiles)


def start_order(model: MigGpuModel, profile: MigProfile,
                workload: MigWorkload | None = None) -> tuple[int, ...]:
    """``profile``'s starts in the order a first-fit allocator should try them: by how much F
    (:func:`gpu_fragmentation`, ``workload`` or :func:`default_workload`) an instance there
    leaves on an otherwise empty GPU, least first, ties to the lower start. One fixed order,
    because DRA's allocator walks a slice's devices in order and takes the first that fits
    (docs/dra.md): the top of the GPU first for the small profiles, keeping slices 0-3 for a
    4g and the whole GPU as long as it can (a 3g at 4 before 0, a 1g at 6 before 0)."""
    chosen = workload if workload is not None else default_workload(model)
    return tuple(sorted(profile.starts, key=lambda start: (
        gpu_fragmentation(model, profile.mask_at(start), chosen), start)))


@cache
def slice_order(model: MigGpuModel) -> tuple[tuple[MigProfile, int], ...]:
    """One GPU's placements in the order the DRA driver publishes them (``node.dra.slices``:
    profiles smallest first, each profile's starts in :func:`start_order`), which is the
    order kube-scheduler's first fit walks them in."""
    return tuple((profile, start) for profile in model.profiles
                 for start in start_order(model, profile))


def dynamic_instances(model: MigGpuModel, gpus: Sequence[int],
                      held: Iterable[tuple[int, str, int]], ask: Mapping[str, int]
                      ) -> tuple[MigInstance, ...]:
    """The instances of a node whose MIG GPUs (``gpus``, by index) are cut per claim (DRA's
    partitionable devices, docs/dra.md): nothing exists until it is allocated, so every
    legal placement that overlaps none in use is free.

    In use: the ``held`` placements (GPU, profile, start: the claims' allocations; one the
    model lacks, on another GPU, or overlapping one before it is left out), then ``ask``
    (profile -> instances allocated nowhere yet: a pod assumed before its allocation shows),
    each where first fit takes it: the lowest GPU, and there the first free placement in
    :func:`slice_order` (largest profiles first; one that fits nowhere is left out). Then
    every free placement, in that order on each GPU, overlapping one another as placements
    do: a caller choosing several (:func:`best_instances`) never takes two that overlap."""
    by_name = profiles_by_name(model)
    taken = dict.fromkeys(gpus, 0)
    used: list[MigInstance] = []
    for gpu, name, start in held:
        profile = by_name.get(name)
        if (profile is None or gpu not in taken or start not in profile.starts
                or taken[gpu] & profile.mask_at(start)):
            continue
        taken[gpu] |= profile.mask_at(start)
        used.append(MigInstance(gpu, name, start, True))
    order = slice_order(model)
    for profile in sorted((by_name[n] for n in ask if n in by_name),
                          key=lambda p: (-p.slices, p.name)):
        for _ in range(ask[profile.name]):
            spot = next(((g, start) for g in sorted(taken) for p, start in order
                         if p is profile and not taken[g] & p.mask_at(start)), None)
            if spot is None:
                break
            taken[spot[0]] |= profile.mask_at(spot[1])
            used.append(MigInstance(spot[0], profile.name, spot[1], True))
    free = [MigInstance(g, p.name, start) for g in sorted(taken) for p, start in order
            if not taken[g] & p.mask_at(start)]
    return (*sorted(used, key=lambda i: (i.gpu, i.start)), *free)


def all_profile_names() -> tuple[str, ...]:
    """Every profile name of the table, each once, sorted by compute then memory: the names
    a DeviceClass per profile covers (a name means one shape within a family, and families
    share names: 1g.10gb is an A100 40GB's two-slice 1g and an A100 80GB's one-slice 1g)."""
    names = {p.name for m in MIG_MODELS.values() for p in m.profiles}
    return tuple(sorted(names, key=lambda n: tuple(int(x) for x in re.findall(r"\d+", n))))
