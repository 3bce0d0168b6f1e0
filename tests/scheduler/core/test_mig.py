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
    MigWorkload,
    best_placement,
    covered,
    fragment_slices,
    free_slices,
    gpu_fragmentation,
    mig_model,
    placements,
    taken_mask,
)

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
