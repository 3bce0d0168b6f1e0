"""gpufrag.membudget: the parse cost read off a body bounds what parsing it holds, and the
budget refuses, waits and gives back as it says."""

from __future__ import annotations

import threading
import tracemalloc

import orjson
import pytest

from gpufrag.membudget import BudgetBusy, MemoryBudget, OverBudget, parse_cost, worst_cost

NODE = {"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.product": "A100"}},
        "status": {"allocatable": {"cpu": "96", "nvidia.com/gpu": "8"},
                   "images": [{"names": ["registry.example/model:v1"], "sizeBytes": 10**9}]}}
BODIES = {
    "node names": orjson.dumps({"Pod": {}, "NodeNames": [f"node-{i:06d}" for i in range(20_000)]}),
    "full nodes": orjson.dumps({"Pod": {}, "Nodes": {"items": [NODE] * 2_000}}),
    "empty objects": b"[" + b",".join([b"{}"] * 50_000) + b"]",
    "empty lists": b"[" + b",".join([b"[]"] * 50_000) + b"]",
    "one-key objects": b"[" + b",".join([b'{"metadata":{"name":"a"}}'] * 20_000) + b"]",
    "floats": b"[" + b",".join([b"0.5"] * 50_000) + b"]",
    "a wide string": orjson.dumps({"Pod": {"x": "\U0001f600" + "a" * 200_000}}),
    "distinct keys": orjson.dumps({f"k{i:07d}": i for i in range(20_000)}),
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_the_cost_bounds_what_parsing_the_body_holds(body: bytes) -> None:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        parsed = orjson.loads(body)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert parsed is not None
    assert held <= parse_cost(body), (held, parse_cost(body))


@pytest.mark.parametrize("body", [*BODIES.values(), b"[{},{},{}]", b"{}", b"[[],[]]",
                                  '[{},"\u00e9"]'.encode(), b'{"":{},"":{}}', b"1"])
def test_no_body_costs_more_than_the_worst_for_its_size(body: bytes) -> None:
    assert parse_cost(body) <= worst_cost(len(body))


def test_a_cost_over_the_whole_budget_is_refused_at_once() -> None:
    budget = MemoryBudget(1000, wait_s=60, setting="server.memory_budget_bytes")
    with pytest.raises(OverBudget, match=r"server\.memory_budget_bytes"):
        budget.reserve(1001)
    assert budget.held_bytes == 0


def test_a_second_reservation_without_room_is_refused_after_its_wait() -> None:
    budget = MemoryBudget(1000, wait_s=0)
    first = budget.reserve(700)
    with pytest.raises(BudgetBusy):
        budget.reserve(400)
    assert budget.reserve(300).cost == 300  # what fits beside it is not held back
    first.release()
    first.release()  # once only
    assert budget.held_bytes == 300


def test_a_second_reservation_waits_for_the_room_the_first_gives_back() -> None:
    budget = MemoryBudget(1000, wait_s=60)
    first = budget.reserve(700)
    waiting = threading.Event()
    got: list[int] = []

    def second() -> None:
        waiting.set()
        got.append(budget.reserve(400).cost)

    thread = threading.Thread(target=second)
    thread.start()
    assert waiting.wait(10)
    assert not got  # no room while the first holds it (700 + 400 > 1000)
    first.release()
    thread.join(30)
    assert got == [400] and budget.held_bytes == 400


def test_growing_is_refused_like_reserving_and_a_charge_only_when_it_never_fits() -> None:
    budget = MemoryBudget(1000, wait_s=0)
    held = budget.reserve(600)
    other = budget.reserve(300)
    with pytest.raises(BudgetBusy):
        other.grow(200)
    with pytest.raises(OverBudget):
        other.grow(800)
    other.grow(100)
    assert budget.held_bytes == 1000
    charged = budget.charge(500)  # an event loop's request: counted, never held back
    charged.grow(50)
    with pytest.raises(OverBudget):
        budget.charge(1001)
    assert budget.held_bytes == 1550
    with pytest.raises(BudgetBusy):
        held.grow(1)
    charged.release()
    held.shrink(100)
    assert budget.held_bytes == 500
    with held, other:
        pass
    assert budget.held_bytes == 0
