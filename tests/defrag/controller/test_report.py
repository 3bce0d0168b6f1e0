"""The plan table, the JSON lines and the metrics summary."""

from __future__ import annotations

import json

from defrag.controller.executor import CycleReport, MoveResult
from defrag.controller.metrics import CycleMetrics
from defrag.controller.planner import plan
from defrag.controller.report import plan_json, plan_table, result_json
from scheduler.policies import make_policy
from tests.defrag.controller.builders import config
from tests.defrag.controller.test_planner import WORKLOAD, three_nodes


def test_table_and_json_say_the_same_thing() -> None:
    the_plan = plan(three_nodes(), make_policy("fgd", workload=WORKLOAD), WORKLOAD, config())
    table = plan_table(the_plan, dry_run=True)
    assert table.splitlines()[0].startswith("defrag plan (dry run): 1 move; 2 triggered nodes")
    assert "ns/a" in table and "n0 (0)" in table and "n1 (0)" in table
    assert "source node received a pod this cycle" in table
    doc = json.loads(plan_json(the_plan, dry_run=True))
    assert doc["kind"] == "plan" and doc["moves"][0]["target"] == "n1"
    assert doc["before"]["free_whole_gpus"] == 3 and doc["predicted_after"]["free_whole_gpus"] == 4
    report = CycleReport(results=[MoveResult(the_plan.moves[0], "landed", "n1", "ns/a-2")],
                         before=the_plan.before, after=the_plan.after)
    result = json.loads(result_json(report, {"evicted": 1}, dry_run=False))
    assert result["ok"] and result["moves"][0]["landed_on"] == "n1"


def test_metrics_summary_and_registry() -> None:
    the_plan = plan(three_nodes(), make_policy("fgd", workload=WORKLOAD), WORKLOAD, config())
    metrics = CycleMetrics(dry_run=False)
    metrics.planned(1, 0.01)
    metrics.evicted()
    metrics.landed(True)
    metrics.refused("pdb")
    metrics.phase("before", the_plan.before)
    metrics.phase("after", the_plan.after)
    lines = "\n".join(metrics.summary_lines(the_plan.before, the_plan.after))
    assert "evicted" in lines and "refused (pdb)" in lines and "free whole GPUs" in lines
    names = {m.name for m in metrics.registry.collect()}
    assert {"gpufrag_defrag_evictions", "gpufrag_defrag_free_whole_gpus",
            "gpufrag_defrag_fragmentation_ratio", "gpufrag_defrag_idle_ratio"} <= names
    value = metrics.registry.get_sample_value("gpufrag_defrag_free_whole_gpus",
                                              {"phase": "after"})
    assert value == 4.0


def test_the_table_says_what_the_daily_budget_left() -> None:
    snap = three_nodes()
    snap.evicted_last_day = 1
    the_plan = plan(snap, make_policy("fgd", workload=WORKLOAD), WORKLOAD,
                    config(max_evictions_per_day_pct=50.0))
    assert ("daily budget: 0 evictions left (50% of 3 running GPU pods = 1 in any 24 hours; "
            "1 in the last 24 hours)") in plan_table(the_plan)
    no_budget = plan(snap, make_policy("fgd", workload=WORKLOAD), WORKLOAD, config())
    assert "daily budget" not in plan_table(no_budget)
