"""scheduler.core.mig: NVIDIA's placement rules, FGD's fragmentation over free slices, and the
choice of (GPU, start) where it grows least."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.mig import (
    ALL_FREE,
    MIG_MODELS,
    MILLI_PER_SLICE,
    MigInstance,
    MigWorkload,
    all_profile_names,
    best_instances,
    best_placement,
    covered,
    default_workload,
    dynamic_instances,
    fragment_slices,
    fragmentation_table,
    free_slices,
    gpu_fragmentation,
    mark_in_use,
    mig_model,
    most_per_gpu,
    pack_instances,
    placements,
    taken_mask,
    used_masks,
)
from scheduler.core.mig_layout import full_layouts

A100 = MIG_MODELS["A100-40GB"]
H100 = MIG_MODELS["H100-80GB"]


@st.composite
def layouts(draw: st.DrawFn) -> tuple[str, int]:
    """A GPU family and a taken mask built only from legal placements, in a random order."""
    family = draw(st.sampled_from(sorted(MIG_MODELS)))
    model = MIG_MODELS[family]
    taken = 0
    for _ in range(draw(st.integers(0, 7))):
        profile = draw(st.sampled_from(model.profiles))
        starts = list(placements(profile, taken))
        if starts:
            taken |= profile.mask_at(draw(st.sampled_from(starts)))
    return family, taken


@given(layouts())
def test_every_placement_respects_the_start_rules_and_overlaps_nothing(layout: tuple[str, int]
                                                                       ) -> None:
    family, taken = layout
    for profile in MIG_MODELS[family].profiles:
        for start in placements(profile, taken):
            assert start in profile.starts
            assert profile.mask_at(start) & taken == 0
            assert profile.mask_at(start) <= ALL_FREE


@given(layouts())
def test_fragmentation_is_zero_when_every_free_slice_fits_the_smallest_profile(
        layout: tuple[str, int]) -> None:
    family, taken = layout
    smallest = MIG_MODELS[family].profiles[0]
    workload = MigWorkload({smallest.name: 1.0})
    free = ALL_FREE & ~taken
    frag = gpu_fragmentation(MIG_MODELS[family], taken, workload)
    if covered(smallest, taken) == free:
        assert frag == 0.0
    else:  # the one slice no 1g.<n>gb can start at (7) is free: exactly that is lost
        assert frag == (free & ~covered(smallest, taken)).bit_count() * MILLI_PER_SLICE > 0


@given(layouts(), st.integers(0, ALL_FREE))
def test_taking_slices_never_makes_a_profile_more_usable(layout: tuple[str, int],
                                                         more: int) -> None:
    family, taken = layout
    for profile in MIG_MODELS[family].profiles:
        before = covered(profile, taken)
        after = covered(profile, taken | more)
        assert after & ~before == 0  # monotone: what a profile can use only shrinks
        assert fragment_slices(profile, taken) <= free_slices(taken)


def test_known_layouts_of_an_a100() -> None:
    one_g, three_g, four_g, seven_g = (A100.profile(n) for n in
                                       ("1g.5gb", "3g.20gb", "4g.20gb", "7g.40gb"))
    assert one_g and three_g and four_g and seven_g
    # An empty A100: a 1g.5gb may start at 0-6, never at 7, so slice 7 is lost to it.
    assert list(placements(one_g, 0)) == [0, 1, 2, 3, 4, 5, 6]
    assert fragment_slices(one_g, 0) == 1
    # A 3g.20gb at slice 4: the first half stays a 4g.20gb, never a 7g.40gb.
    half = taken_mask(A100, [("3g.20gb", 4)])
    assert fragment_slices(four_g, half) == 0
    assert fragment_slices(seven_g, half) == 4
    assert gpu_fragmentation(A100, half, MigWorkload({"4g.20gb": 0.5, "7g.40gb": 0.5})) == \
        0.5 * 4 * MILLI_PER_SLICE
    # A 1g.5gb at slice 1: no 3g.20gb can start at 0 any more; slices 0, 2, 3 are lost to it.
    assert fragment_slices(three_g, taken_mask(A100, [("1g.5gb", 1)])) == 3


def test_fgd_keeps_the_other_half_whole_for_the_workload_s_big_profile() -> None:
    workload = MigWorkload({"3g.20gb": 0.8, "1g.5gb": 0.2})
    one_g = A100.profile("1g.5gb")
    assert one_g is not None
    taken = [0]
    starts = []
    for _ in range(3):
        choice = best_placement(A100, taken, one_g, workload)
        assert choice is not None and choice.gpu == 0
        starts.append(choice.start)
        taken[0] |= one_g.mask_at(choice.start)
    # Packed into one half: the other half still takes a 3g.20gb.
    assert all(s < 4 for s in starts) or all(s >= 4 for s in starts), starts
    three_g = A100.profile("3g.20gb")
    assert three_g is not None and list(placements(three_g, taken[0]))


def test_fgd_puts_an_instance_on_slices_the_big_profile_could_never_use() -> None:
    workload = MigWorkload({"4g.40gb": 1.0})
    two_g = H100.profile("2g.20gb")
    assert two_g is not None
    # GPU 0 is empty: a 4g.40gb starts only at 0, so slices 4-7 are lost to it already. GPU 1
    # holds a 3g.40gb at 4: its free half is exactly one 4g.40gb, which a 2g there would break.
    taken = [0, taken_mask(H100, [("3g.40gb", 4)])]
    choice = best_placement(H100, taken, two_g, workload)
    assert choice is not None
    assert (choice.gpu, choice.start, choice.delta_milli) == (0, 4, -2 * MILLI_PER_SLICE)
    # Where only GPU 1 is left, it is taken all the same, at a cost: its other two slices
    # no longer make a 4g.40gb.
    only = best_placement(H100, [ALL_FREE, taken[1]], two_g, workload)
    assert only is not None and (only.gpu, only.delta_milli) == (1, 2 * MILLI_PER_SLICE)
    assert best_placement(H100, [ALL_FREE], two_g, workload) is None


@pytest.mark.parametrize(("instances", "message"), [
    ([("9g.1gb", 0)], "has no MIG profile '9g.1gb'"),
    ([("3g.20gb", 2)], "3g.20gb cannot start at slice 2 on A100-40GB (starts: 0, 4)"),
    ([("4g.20gb", 0), ("1g.5gb", 3)], "1g.5gb at slice 3 overlaps another instance"),
])
def test_a_bad_layout_is_refused_naming_the_instance(instances: list[tuple[str, int]],
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        taken_mask(A100, instances)


@pytest.mark.parametrize(("product", "memory_mib", "family"), [
    ("NVIDIA-A100-SXM4-40GB", 40960, "A100-40GB"),
    ("NVIDIA-A100-PCIE-40GB", 0, "A100-40GB"),
    ("NVIDIA-A100-SXM4-80GB", 81920, "A100-80GB"),
    ("NVIDIA-A100-80GB-PCIe", 0, "A100-80GB"),
    ("NVIDIA-H100-80GB-HBM3", 81559, "H100-80GB"),
    ("NVIDIA-H200", 143771, "H200-141GB"),
    ("Tesla-V100-SXM2-32GB", 32768, None),
    ("NVIDIA-H100-NVL", 95830, None),  # 94 GB: other profiles, not in the table
])
def test_products_resolve_to_their_mig_model(product: str, memory_mib: int,
                                             family: str | None) -> None:
    model = mig_model(product, memory_mib)
    assert (model.family if model else None) == family


def test_the_smallest_fitting_profile_and_the_workload_s_checks() -> None:
    assert (H100.smallest_fitting(12_000) or H100.profiles[0]).name == "1g.20gb"
    assert A100.smallest_fitting(50_000) is None
    assert MigWorkload.from_counts([("1g.5gb", 3), ("3g.20gb", 1)]).popularity == {
        "1g.5gb": 0.75, "3g.20gb": 0.25}
    for bad, message in (({}, "at least one"), ({"1g.5gb": 0.5}, "sum to 1"),
                         ({"big": 1.0}, "not MIG profile names: big")):
        with pytest.raises(ValueError, match=message):
            MigWorkload(bad)


# ------------------------------------------------------------------ nodes in static MIG

def _legal_and_apart(family: str, instances: tuple[MigInstance, ...]) -> None:
    """Every instance at one of its profile's starts, none overlapping another on its GPU."""
    model = MIG_MODELS[family]
    by_gpu: dict[int, list[tuple[str, int]]] = {}
    for instance in instances:
        by_gpu.setdefault(instance.gpu, []).append((instance.profile, instance.start))
    for placed in by_gpu.values():
        taken_mask(model, placed)  # raises on an illegal start or an overlap


@st.composite
def counts_on_gpus(draw: st.DrawFn, most: int) -> tuple[str, int, dict[str, int]]:
    """A GPU family, a number of GPUs and up to ``most`` instances of each of its profiles."""
    family = draw(st.sampled_from(sorted(MIG_MODELS)))
    counts = {p.name: draw(st.integers(0, most)) for p in MIG_MODELS[family].profiles}
    return family, draw(st.integers(1, most)), counts


@given(counts_on_gpus(8))
def test_the_packing_places_any_counts_at_legal_starts_only(
        node: tuple[str, int, dict[str, int]]) -> None:
    family, gpus, counts = node
    model = MIG_MODELS[family]
    placed, left = pack_instances(model, counts, gpus)
    _legal_and_apart(family, placed)
    assert all(0 <= i.gpu < gpus for i in placed)
    for p in model.profiles:  # every instance is placed or said to be left over
        assert sum(i.profile == p.name for i in placed) + left.get(p.name, 0) == counts[p.name]


@given(st.sampled_from(sorted(MIG_MODELS)), st.integers(1, 8), st.data())
def test_one_full_layout_on_every_gpu_is_packed_whole(family: str, gpus: int,
                                                      data: st.DataObject) -> None:
    model = MIG_MODELS[family]
    layout = data.draw(st.sampled_from(full_layouts(model)))
    placed, left = pack_instances(model, {p: n * gpus for p, n in layout.counts}, gpus)
    assert not left
    assert len(placed) == gpus * sum(n for _, n in layout.counts)


def test_the_packing_is_first_fit_largest_first_and_says_what_it_cannot_place() -> None:
    placed, left = pack_instances(H100, {"3g.40gb": 1, "4g.40gb": 1, "1g.10gb": 2,
                                         "9g.1gb": 1}, 2)
    assert [(i.gpu, i.profile, i.start) for i in placed] == [
        (0, "4g.40gb", 0), (0, "3g.40gb", 4), (1, "1g.10gb", 0), (1, "1g.10gb", 1)]
    assert left == {"9g.1gb": 1}
    assert pack_instances(H100, {"7g.80gb": 2}, 1)[1] == {"7g.80gb": 1}
    # First fit would put the 1g.10gb (two slices) at 4 and strand a 1g.5gb: the search
    # moves it to 6, where slice 7 (no 1g.5gb starts there) is its second slice.
    placed, left = pack_instances(A100, {"4g.20gb": 1, "1g.10gb": 1, "1g.5gb": 2}, 1)
    assert not left
    assert [(i.profile, i.start) for i in placed] == [
        ("4g.20gb", 0), ("1g.5gb", 4), ("1g.5gb", 5), ("1g.10gb", 6)]


def test_counts_in_use_mark_the_first_instances_of_each_profile() -> None:
    placed, _ = pack_instances(H100, {"3g.40gb": 2, "1g.10gb": 7}, 2)
    marked = mark_in_use(placed, {"3g.40gb": 1, "1g.10gb": 2})
    assert [(i.gpu, i.start) for i in marked if i.in_use and i.profile == "3g.40gb"] == [(0, 0)]
    assert [(i.gpu, i.start) for i in marked if i.in_use and i.profile == "1g.10gb"] == [
        (1, 0), (1, 1)]
    assert used_masks(H100, marked) == {0: 0b1111, 1: 0b11}


def _node(*instances: tuple[int, str, int, bool]) -> tuple[MigInstance, ...]:
    return tuple(MigInstance(g, p, s, u) for g, p, s, u in instances)


def test_a_2g_goes_where_it_strands_least_for_a_4g_heavy_workload() -> None:
    workload = MigWorkload({"4g.40gb": 0.8, "2g.20gb": 0.2})
    # GPU 0: 2g instances at 0, 2 (in use) and 4 (free) - a 4g could never start there again.
    # GPU 1: 2g instances at 0 (free), 2, 4 (in use): its free 2g sits where a 4g starts.
    instances = _node((0, "2g.20gb", 0, True), (0, "2g.20gb", 2, True),
                      (0, "2g.20gb", 4, False), (1, "2g.20gb", 0, False),
                      (1, "2g.20gb", 2, True), (1, "2g.20gb", 4, True))
    fit = best_instances(H100, instances, {"2g.20gb": 1}, workload)
    assert fit is not None
    assert [(i.gpu, i.start) for i in fit.chosen] == [(0, 4)]
    assert fit.delta_milli < 0  # it takes slices already lost to the 4g.40gb
    # Only GPU 1's instance left: taking it costs nothing either, both halves are broken.
    assert best_instances(H100, instances[3:], {"2g.20gb": 1}, workload) is not None
    assert best_instances(H100, instances, {"3g.40gb": 1}, workload) is None


def test_several_instances_are_chosen_one_after_the_other_never_twice() -> None:
    placed, _ = pack_instances(A100, {"1g.5gb": 7}, 1)
    fit = best_instances(A100, placed, {"1g.5gb": 3}, default_workload(A100))
    assert fit is not None and len({(i.gpu, i.start) for i in fit.chosen}) == 3
    assert best_instances(A100, placed, {"1g.5gb": 8}, default_workload(A100)) is None


def test_an_instance_at_a_start_nvml_never_gives_is_not_chosen() -> None:
    bad = _node((0, "3g.20gb", 2, False))
    assert best_instances(A100, bad, {"3g.20gb": 1}, default_workload(A100)) is None


@given(counts_on_gpus(4), st.data())
def test_no_chosen_instance_is_ever_at_an_illegal_start(node: tuple[str, int, dict[str, int]],
                                                        data: st.DataObject) -> None:
    family, gpus, counts = node
    model = MIG_MODELS[family]
    placed, _ = pack_instances(model, counts, gpus)
    used = {p.name: data.draw(st.integers(0, 4)) for p in model.profiles}
    instances = mark_in_use(placed, used)
    ask = {data.draw(st.sampled_from(model.profiles)).name: data.draw(st.integers(1, 2))}
    fit = best_instances(model, instances, ask, default_workload(model))
    free = {(i.gpu, i.start) for i in instances if not i.in_use}
    if fit is None:
        return
    _legal_and_apart(family, tuple(i for i in instances if i.in_use) + fit.chosen)
    assert all((i.gpu, i.start) in free for i in fit.chosen)
    assert sorted(i.profile for i in fit.chosen) == sorted(p for p, n in ask.items()
                                                           for _ in range(n))


@given(layouts())
def test_the_fragmentation_table_is_f_by_taken_mask(layout: tuple[str, int]) -> None:
    family, taken = layout
    model = MIG_MODELS[family]
    workload = default_workload(model)
    assert fragmentation_table(model, workload)[taken] == gpu_fragmentation(model, taken,
                                                                            workload)


def test_the_most_instances_of_a_profile_on_one_gpu_follow_its_placements() -> None:
    # A one-slice 1g at every start 0-6, a two-slice 1g or a 2g at even starts, a 3g at 0
    # or 4, a 4g and a 7g once; 1g.10gb is the A100 80GB's one-slice 1g (7), not the A100
    # 40GB's two-slice one (4); a name no family has, none.
    assert [most_per_gpu(p) for p in ("1g.10gb", "1g.5gb", "1g.20gb", "2g.20gb", "3g.40gb",
                                      "4g.40gb", "7g.80gb", "5g.99gb")] == [7, 7, 4, 3, 2, 1,
                                                                             1, 0]
    assert all(most_per_gpu(p) for p in all_profile_names())


# ---------------------------------------------------------------- dynamic MIG (DRA partitions)
def test_dynamic_instances_hold_the_allocated_then_first_fit_then_every_free_placement() -> None:
    # H100: a 3g allocated at 0 on GPU 1; a 4g asked, allocated nowhere yet; GPU 3 has none.
    found = dynamic_instances(H100, (1, 3), [(1, "3g.40gb", 0), (7, "3g.40gb", 0)],
                              {"4g.40gb": 1, "7g.80gb": 1})
    used = [i for i in found if i.in_use]
    # The asks largest first, each where first fit takes it: the 7g on GPU 3 (GPU 1's
    # slices 0-3 are taken); the 4g then fits nowhere and is left out, as is the placement
    # on GPU 7 (not one of the MIG GPUs).
    assert used == [MigInstance(1, "3g.40gb", 0, True), MigInstance(3, "7g.80gb", 0, True)]
    free = [i for i in found if not i.in_use]
    assert {(i.gpu, i.start) for i in free} == {(1, 4), (1, 5), (1, 6)}
    assert free[0].profile == "1g.10gb"  # the slice's order: smallest profile first
    # A small profile's first fit is the top of the GPU (start_order), as the allocator's.
    assert [i for i in dynamic_instances(H100, (0,), [], {"1g.10gb": 1}) if i.in_use] == [
        MigInstance(0, "1g.10gb", 6, True)]


def test_best_instances_never_takes_two_free_placements_that_overlap() -> None:
    free = dynamic_instances(H100, (0,), [], {})
    fit = best_instances(H100, free, {"4g.40gb": 1, "3g.40gb": 1}, default_workload(H100))
    assert fit is not None and {(i.profile, i.start) for i in fit.chosen} == {
        ("4g.40gb", 0), ("3g.40gb", 4)}
    assert best_instances(H100, free, {"4g.40gb": 2}, default_workload(H100)) is None
