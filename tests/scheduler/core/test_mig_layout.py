"""scheduler.core.mig_layout: the full layouts of a MIG GPU, and the advisor that cuts a
cluster's GPUs in the demand's mix."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gpufrag.conventions import LABEL_MIG_CONFIG
from scheduler.core.mig import MIG_MODELS, SLICES, placements, taken_mask
from scheduler.core.mig_layout import MAX_LABEL_VALUE, advise_layouts, full_layouts

H100 = MIG_MODELS["H100-80GB"]
FAMILIES = sorted(MIG_MODELS)
LABEL_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layout_is_legal_full_and_named_as_a_label_can_be(family: str) -> None:
    model = MIG_MODELS[family]
    layouts = full_layouts(model)
    assert layouts is full_layouts(model)  # enumerated once per family
    assert len({layout.counts for layout in layouts}) == len(layouts)
    for layout in layouts:
        taken = taken_mask(model, layout.instances)  # raises on a bad start or an overlap
        assert taken.bit_count() == layout.used_slices
        assert not any(next(placements(p, taken), None) is not None for p in model.profiles)
        assert sum(n for _, n in layout.counts) == len(layout.instances)
        assert len(layout.config_name) <= MAX_LABEL_VALUE
        assert set(layout.config_name) <= LABEL_CHARS
    if family == "H100-80GB":  # the common layouts of NVIDIA's MIG manager's default config
        assert {"7x1g.10gb", "4x1g.20gb", "1x1g.10gb-3x2g.20gb", "2x3g.40gb",
                "1x3g.40gb-1x4g.40gb", "1x7g.80gb"} <= {layout.name for layout in layouts}


def _demand() -> st.SearchStrategy[dict[str, int]]:
    names = [p.name for p in H100.profiles]
    return st.dictionaries(st.sampled_from(names), st.integers(1, 500), min_size=1)


@given(_demand(), st.lists(st.integers(1, 8), min_size=1, max_size=12))
def test_the_advisor_only_proposes_full_layouts_of_the_family(demand: dict[str, int],
                                                             gpus: list[int]) -> None:
    nodes = [(f"n{i}", g) for i, g in enumerate(gpus)]
    advice = advise_layouts(H100, nodes, demand)
    assert list(advice.by_node) == [n for n, _ in nodes]
    legal = set(full_layouts(H100))
    assert all(layout in legal for layout in advice.by_node.values())
    capacity = SLICES * sum(gpus)
    assert 0 <= advice.stranded_slices <= capacity
    for name, d in demand.items():
        assert advice.served[name] + advice.unserved.get(name, 0.0) == pytest.approx(d)


@given(st.sampled_from([p.name for p in H100.profiles]),
       st.lists(st.integers(1, 8), min_size=1, max_size=8), st.integers(1, 10_000))
def test_one_profile_demanded_gives_the_layout_with_the_most_of_it(
        profile: str, gpus: list[int], count: int) -> None:
    most = max(layout.count(profile) for layout in full_layouts(H100))
    advice = advise_layouts(H100, [(f"n{i}", g) for i, g in enumerate(gpus)], {profile: count})
    assert {layout.count(profile) for layout in advice.by_node.values()} == {most}


def test_a_mixed_demand_is_cut_in_its_mix_and_written_as_mig_parted_config() -> None:
    # 16 GPUs: 14 3g.40gb, 16 1g.10gb and two whole-GPU pods, in 128 slices.
    nodes = [("big", 8), ("mid", 4), ("small-a", 2), ("small-b", 2)]
    advice = advise_layouts(H100, nodes, {"3g.40gb": 10, "1g.10gb": 12},
                            pending={"3g.40gb": 4, "1g.10gb": 4, "7g.80gb": 2, "1g.5gb": 3})
    assert advice.ignored == ("1g.5gb",)  # an A100-40GB profile: no H100 has it
    assert advice.unserved == {}
    supply: dict[str, int] = {}
    for node, gpus in nodes:
        for profile, n in advice.by_node[node].counts:
            supply[profile] = supply.get(profile, 0) + gpus * n
    assert supply["3g.40gb"] >= 14 and supply["1g.10gb"] >= 16 and supply["7g.80gb"] >= 2
    labels = advice.labels()
    assert labels["big"] == advice.by_node["big"].config_name
    config = yaml.safe_load(advice.mig_parted_config())
    assert config["version"] == "v1"
    assert config["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    for node, _ in nodes:
        entry = config["mig-configs"][labels[node]]
        assert entry == [{"devices": "all", "mig-enabled": True,
                          "mig-devices": dict(advice.by_node[node].counts)}]
    assert LABEL_MIG_CONFIG == "nvidia.com/mig.config"


def test_a_demand_above_capacity_serves_what_fits_and_says_what_not() -> None:
    advice = advise_layouts(H100, [("a", 1)], {"4g.40gb": 3, "3g.40gb": 1})
    assert advice.by_node["a"].name == "1x3g.40gb-1x4g.40gb"
    assert advice.unserved == {"4g.40gb": 2.0}
    assert advice.stranded_slices == 0


@pytest.mark.parametrize(("nodes", "demand", "message"), [
    ([("a", 1)], {"1g.5gb": 3}, "no demand for any H100-80GB MIG profile"),
    ([("a", 1)], {"1g.10gb": -1}, "MIG demand for 1g.10gb is negative"),
    ([("a", 0)], {"1g.10gb": 1}, "nodes without GPUs cannot carry a MIG layout: a"),
])
def test_bad_demand_or_nodes_are_refused_naming_them(nodes: list[tuple[str, int]],
                                                      demand: dict[str, int],
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        advise_layouts(H100, nodes, demand)
