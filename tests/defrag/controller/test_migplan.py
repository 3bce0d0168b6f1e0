"""The MIG step's plan: only drained, free MIG nodes are relabelled, to the advisor's layout,
within their budget; everything else keeps its label, with the reason."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from defrag.controller.executor import DryRunActions
from defrag.controller.migplan import MigNodeFacts, Relabel, plan_dict, plan_lines, plan_mig
from scheduler.core.mig import MIG_MODELS

A100 = MIG_MODELS["A100-80GB"]
ALL_1G = "all-1g.10gb"


def mig_node(name: str = "mig-0", **overrides: Any) -> MigNodeFacts:
    fields: dict[str, Any] = dict(name=name, model=A100, gpus=2, config=ALL_1G,
                                  offers={"1g.10gb": 14})
    fields.update(overrides)
    return MigNodeFacts(**fields)


def test_a_drained_node_gets_the_layout_the_demand_asks() -> None:
    plan = plan_mig([mig_node()], {"3g.40gb": 4}, max_relabels=1)
    assert plan.relabels == [Relabel("mig-0", ALL_1G, "gpufrag-2x3g.40gb")]
    assert plan.demand == {"3g.40gb": 4} and plan.kept == []


def test_a_busy_node_is_never_relabelled_and_its_instances_serve_the_demand() -> None:
    busy = mig_node("mig-busy", busy=("serving/bert-0",), offers={"3g.40gb": 4},
                    asks={"3g.40gb": 1}, config="all-3g.40gb")
    plan = plan_mig([busy, mig_node()], {"3g.40gb": 3}, max_relabels=5)
    # The busy node's four 3g.40gb serve all four asks: nothing left to re-cut for.
    assert plan.relabels == [] and plan.busy == 1 and plan.demand == {"3g.40gb": 4}
    assert plan.kept == [("mig-0", "the demand is served by the other MIG nodes")]
    more = plan_mig([busy, mig_node()], {"3g.40gb": 5}, max_relabels=5)
    assert more.relabels == [Relabel("mig-0", ALL_1G, "gpufrag-2x3g.40gb")]


def test_the_same_label_is_no_action() -> None:
    plan = plan_mig([mig_node(config="gpufrag-2x3g.40gb")], {"3g.40gb": 4}, max_relabels=1)
    assert plan.relabels == []
    assert plan.kept == [("mig-0", "already carries the advised 2x3g.40gb (gpufrag-2x3g.40gb)")]
    # NVIDIA's all-<profile> is the advisor's one-profile layout by another name.
    same = plan_mig([mig_node(config="all-3g.40gb")], {"3g.40gb": 4}, max_relabels=1)
    assert same.relabels == [] and same.kept[0][1].endswith("(all-3g.40gb)")


def test_the_budget_caps_relabels_in_node_order() -> None:
    nodes = [mig_node(f"mig-{i}") for i in (2, 0, 1)]
    plan = plan_mig(nodes, {"3g.40gb": 12}, max_relabels=2)
    assert [r.node for r in plan.relabels] == ["mig-0", "mig-1"]
    assert plan.kept == [("mig-2", "--max-mig-relabels reached (advised gpufrag-2x3g.40gb)")]
    assert plan_mig(nodes, {"3g.40gb": 12}, max_relabels=0).relabels == []


@pytest.mark.parametrize(("overrides", "why"), [
    (dict(reservations=("web-1-abcd",)), "holds the GPU reservation web-1-abcd"),
    (dict(cordoned=True), "cordoned (by someone else: defrag never cordons)"),
    (dict(config_state="pending"), "its MIG manager is still applying the last config"),
    (dict(gpus=0), "no GPU count (label nvidia.com/gpu.count)"),
    (dict(model=None), "GPU product not in the MIG table"),
])
def test_a_drained_node_that_may_not_change_says_why(overrides: dict[str, Any],
                                                     why: str) -> None:
    plan = plan_mig([mig_node(**overrides)], {"3g.40gb": 4}, max_relabels=5)
    assert plan.relabels == [] and plan.kept == [("mig-0", why)]


def test_a_target_of_this_cycles_moves_keeps_its_layout() -> None:
    plan = plan_mig([mig_node()], {"3g.40gb": 4}, max_relabels=5, targets=frozenset({"mig-0"}))
    assert plan.kept == [("mig-0", "a target of this cycle's moves")]


def test_no_demand_for_the_familys_profiles_changes_nothing() -> None:
    assert plan_mig([mig_node()], {}, max_relabels=5).kept == [
        ("mig-0", "no demand for its MIG profiles")]
    # H200 profiles mean nothing to an A100.
    assert plan_mig([mig_node()], {"1g.18gb": 3}, max_relabels=5).kept == [
        ("mig-0", "no demand for its MIG profiles")]


def test_families_share_a_profiles_pending_queue_by_gpus() -> None:
    h100 = mig_node("h100-0", model=MIG_MODELS["H100-80GB"], config="", gpus=6)
    # 8 x 7g.80gb pending: the A100 node (2 of 8 GPUs) is cut for 2, the H100 one for 6.
    plan = plan_mig([mig_node(), h100], {"7g.80gb": 8}, max_relabels=5)
    assert plan.relabels == [Relabel("mig-0", ALL_1G, "gpufrag-1x7g.80gb"),  # by family
                             Relabel("h100-0", "", "gpufrag-1x7g.80gb")]
    # A pod on an A100 asks from the A100 family only.
    busy = mig_node("mig-busy", busy=("a/b",), asks={"1g.20gb": 8}, offers={})
    only_a100 = plan_mig([mig_node(), busy, h100], {}, max_relabels=5)
    assert only_a100.relabels == [Relabel("mig-0", ALL_1G, "gpufrag-4x1g.20gb")]
    assert ("h100-0", "no demand for its MIG profiles") in only_a100.kept


def test_a_dry_run_writes_nothing_and_reports_what_it_would_set() -> None:
    plan = plan_mig([mig_node()], {"3g.40gb": 4}, max_relabels=1)
    lines = plan_lines(plan, dry_run=True)
    assert lines[0] == "MIG layouts: demand 4 x 3g.40gb; 1 relabel(s), 0 busy MIG node(s)"
    assert lines[1] == ("  mig-0: would set nvidia.com/mig.config=gpufrag-2x3g.40gb "
                        f"(was {ALL_1G})")
    dry = DryRunActions()
    assert dry.relabel_mig(plan.relabels[0], 0.0)
    assert dry.written == [("mig.config", "mig-0", "gpufrag-2x3g.40gb")]  # recorded, not sent
    assert plan_dict(plan, dry_run=True)["relabels"] == [
        {"node": "mig-0", "from": ALL_1G, "to": "gpufrag-2x3g.40gb"}]


def test_the_relabel_message_names_both_configs() -> None:
    assert "from all-1g.10gb to gpufrag-2x3g.40gb" in Relabel("n", ALL_1G,
                                                            "gpufrag-2x3g.40gb").message()
    assert "set to gpufrag-1x7g.80gb" in replace(Relabel("n", "", "gpufrag-1x7g.80gb")).message()

