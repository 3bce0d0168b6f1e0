"""What the verbs hold in memory: a body's cost reserved from server.memory_budget_bytes
before it is parsed (413 when it never fits, 503 + Retry-After while others hold the room),
answers in pieces never joined whole, kept encodings of their own size, bounded name lists."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import orjson
import pytest

from gpufrag.membudget import MemoryBudget, parse_cost
from scheduler.extender import wire
from scheduler.extender.app import INLINE_BODY_BYTES, MEMORY_BUDGET
from scheduler.extender.runtime import Runtime
from scheduler.extender.scoring import UNKNOWN, FilterVerdicts, Priorities
from tests.scheduler.extender.helpers import make_config, serve
from tests.scheduler.extender.test_contract import NODES, PENDING

MIB = 1024 * 1024


def _runtime(**server: Any) -> Runtime:
    config = make_config(server={"memory_budget_bytes": MIB, **server},
                         filter={"answer": "feasible"})
    return serve(NODES, [PENDING], config=config)


def _post(runtime: Runtime, path: str, body: Any) -> tuple[int, Any]:
    """POST ``body``, its response read and closed (as the server closes it once sent)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    response = runtime.app.test_client().post(path, data=data, buffered=True,
                                              content_type="application/json")
    return response.status_code, orjson.loads(response.data)


def _budget(runtime: Runtime) -> MemoryBudget:
    budget = runtime.app.extensions[MEMORY_BUDGET]
    assert isinstance(budget, MemoryBudget)
    return budget


def test_a_body_that_would_take_more_than_the_budget_answers_413_and_holds_nothing() -> None:
    runtime = _runtime()
    status, reply = _post(runtime, "/filter", {"Pod": PENDING, "Nodes": {"items": NODES * 2000}})
    assert status == 413
    assert "server.memory_budget_bytes" in reply["Error"] and set(reply) >= {"FailedNodes"}
    assert _budget(runtime).held_bytes == 0


def test_a_node_names_answer_over_the_budget_is_refused_before_the_body_is_parsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = _runtime(memory_budget_bytes=12 * MIB)

    def never(*_: Any) -> None:
        raise AssertionError("parsed, though its answer's cost was known before")

    monkeypatch.setattr(wire, "parse_extender_args", never)
    # 90,000 names, 1.2 MiB (past what is answered on the event loop): ~7 MiB to parse, and
    # 90,000 x 192 bytes of filter answer (~17 MiB), 90,000 x 80 of prioritize (~8 MiB).
    body = orjson.dumps({"Pod": PENDING, "Nodes": None,
                         "NodeNames": [f"node-{i:06d}" for i in range(90_000)]})
    assert len(body) > INLINE_BODY_BYTES and parse_cost(body) < 12 * MIB
    for verb in ("filter", "prioritize"):
        status, reply = _post(runtime, f"/{verb}", body)
        assert status == 413 and "server.memory_budget_bytes" in reply["Error"], reply
    assert _budget(runtime).held_bytes == 0


def test_while_others_hold_the_budget_a_request_waits_then_answers_503_retry_after() -> None:
    runtime = _runtime(read_timeout_s=0.01)  # how long it waits for room
    budget = _budget(runtime)
    held = budget.reserve(budget.total_bytes)
    client = runtime.app.test_client()
    body = {"PodName": "p", "PodNamespace": "serving", "Node": "gpu-a"}
    response = client.post("/preempt", data=orjson.dumps({"Pod": PENDING}),
                           content_type="application/json")
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert "other requests hold the memory" in orjson.loads(response.data)["Error"]
    held.release()
    status, _ = _post(runtime, "/bind", body)
    assert status == 200
    assert budget.held_bytes == 0


def test_a_request_on_the_event_loop_is_never_held_back_but_counted() -> None:
    runtime = _runtime()
    budget = _budget(runtime)
    held = budget.reserve(budget.total_bytes)  # no room at all
    status, reply = _post(runtime, "/filter", {"Pod": PENDING, "NodeNames": ["gpu-a", "gpu-b"]})
    assert status == 200 and reply["Error"] == ""
    held.release()
    assert budget.held_bytes == 0  # its own share went back once its answer was sent


def test_the_reservation_is_held_until_the_answer_is_sent() -> None:
    runtime = _runtime()
    budget = _budget(runtime)
    response = runtime.app.test_client().post(
        "/filter", data=orjson.dumps({"Pod": PENDING, "NodeNames": ["gpu-a"]}),
        content_type="application/json", buffered=False)
    assert budget.held_bytes == len(response.get_data())  # the answer, until it is closed
    response.close()
    assert budget.held_bytes == 0


def _unknown_outcome(count: int, *, unresolvable: bool) -> FilterVerdicts:
    rows = np.full(count, UNKNOWN, np.int64)
    failed = np.arange(count, dtype=np.int64)
    reason = "node not yet known"
    hard = np.arange(count) % 2 == 0 if unresolvable else np.zeros(count, np.bool_)
    return FilterVerdicts(rows, np.zeros(count, np.bool_), failed, [reason] * count, hard,
                          [wire.encode_reason(reason)] * count)


@pytest.mark.parametrize("unresolvable", [False, True])
def test_a_large_filter_answer_comes_in_pieces_that_read_as_one(unresolvable: bool) -> None:
    count = 3 * wire.PIECE_ENTRIES + 5
    names = [f"gone-{i:06d}" for i in range(count)]
    args = wire.ExtenderArgs(PENDING, names, None)
    answer = wire.filter_result(args, _unknown_outcome(count, unresolvable=unresolvable),
                                wire.NodeJson())
    text = b"".join(answer)
    assert max(map(len, answer)) < len(text) / 3  # never the whole, nor most of it
    reply = orjson.loads(text)
    failed = [*reply["FailedNodes"], *reply["FailedAndUnresolvableNodes"]]
    assert sorted(failed) == names and reply["NodeNames"] == [] and reply["Error"] == ""
    assert len(reply["FailedAndUnresolvableNodes"]) == (count + 1) // 2 * unresolvable


def test_a_large_prioritize_answer_comes_in_pieces_that_read_as_one() -> None:
    count = 2 * wire.PIECE_ENTRIES + 1
    names = [f"gone-{i:06d}" for i in range(count)]
    result = Priorities(np.full(count, UNKNOWN, np.int64), np.arange(count) % 11, -1)
    answer = wire.priorities(wire.ExtenderArgs(PENDING, names, None), result, wire.NodeJson())
    assert len(answer) == 5  # "[", three pieces, "]"
    reply = orjson.loads(b"".join(answer))
    assert reply == [{"Host": n, "Score": i % 11} for i, n in enumerate(names)]


def test_nodes_mode_sends_back_the_passed_objects_a_few_at_a_time() -> None:
    items: list[Mapping[str, Any]] = [{**NODES[i % 3], "metadata": {"name": f"n{i}"}}
                                      for i in range(5 * wire.ECHO_ITEMS)]
    passed = np.arange(len(items)) % 2 == 0
    outcome = FilterVerdicts(np.full(len(items), UNKNOWN, np.int64), passed,
                             np.zeros(0, np.int64), [], np.zeros(0, np.bool_), [])
    args = wire.ExtenderArgs(PENDING, [i["metadata"]["name"] for i in items], items)
    answer = wire.filter_result(args, outcome, wire.NodeJson())
    echoed = [len(p) for p in answer if p.startswith(b"{")]
    assert max(echoed) < sum(echoed) / 2
    reply = orjson.loads(b"".join(answer))
    assert reply["Nodes"]["items"] == [item for item, ok in zip(items, passed, strict=True) if ok]


def test_a_kept_encoding_is_the_size_of_its_text() -> None:
    # orjson hands back bytes that keep a ~4 KiB buffer: 1,000 of them kept ~4 MiB.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [wire.json_text(f"node-{i:05d}") for i in range(1000)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept[7] == b'"node-00007"'
    assert held < 200 * 1024, held


def test_name_lists_keep_a_bounded_number_of_names() -> None:
    lists = wire.NameLists(size=8, names=100)
    for i in range(5):
        key = frozenset({f"{i}-{j}".encode() for j in range(40)})
        assert lists.put(key, list(range(40)))[0] is key
        assert lists.kept_names <= 100
    assert lists.kept_names == 80  # the two newest
    huge = frozenset({f"h{j}".encode() for j in range(101)})
    lists.put(huge, list(range(101)))
    assert lists.get(huge) is None and lists.kept_names == 80


def test_a_name_list_too_long_to_keep_is_parsed_but_not_kept() -> None:
    lists = wire.NameLists(names=10)
    names = [f"n{i}" for i in range(11)]
    args = wire.parse_extender_args(orjson.dumps({"Pod": PENDING, "Nodes": None,
                                                  "NodeNames": names}), lists)
    assert args.names == names and args.name_set is None and lists.kept_names == 0
    assert wire.names_sent(orjson.dumps({"Pod": PENDING, "NodeNames": names})) == 11


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lists of more than 50 names are read in chunks of about 64 bytes."""
    monkeypatch.setattr(wire, "MAX_KEPT_NAMES", 50)
    monkeypatch.setattr(wire, "NAME_CHUNK_BYTES", 64)


def _names_body(names: list[Any]) -> bytes:
    return orjson.dumps({"Pod": PENDING, "Nodes": None, "NodeNames": names})


@pytest.mark.usefixtures("small_chunks")
def test_a_long_name_list_is_read_a_chunk_at_a_time_and_reads_as_the_list() -> None:
    names = [f"node-{i:03d}" for i in range(120)]
    args = wire.parse_extender_args(_names_body(names))
    chunks = args.names
    assert isinstance(chunks, wire.NameChunks)
    read = list(chunks.chunks())
    assert len(read) > 10 and all(len(part) < 10 for _, part in read)
    assert [n for _, part in read for n in part] == names
    assert [first for first, _ in read] == [sum(len(p) for _, p in read[:i])
                                           for i in range(len(read))]
    assert len(chunks) == 120 and chunks[0] == names[0] and chunks[-1] == names[-1]
    assert chunks[57] == names[57] and chunks[3:6] == names[3:6]
    with pytest.raises(IndexError):
        chunks[120]
    assert wire.parse_cost_of(_names_body(names)) < parse_cost(_names_body(names))


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_chunked_name_list_is_answered_as_the_whole_list_is(
        verb: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = serve(NODES, [PENDING], config=make_config(filter={"answer": "feasible"}))
    body = _names_body([*(f"gone-{i:03d}" for i in range(100)), "gpu-a", "gpu-b", "cpu-1"])
    read: list[int] = []
    chunks = wire.NameChunks.chunks

    def counted(self: wire.NameChunks) -> Iterator[tuple[int, list[Any]]]:
        read.append(len(self))
        return chunks(self)

    monkeypatch.setattr(wire.NameChunks, "chunks", counted)
    chunked = _post(runtime, f"/{verb}", body)
    assert chunked[0] == 200 and read == [103]
    monkeypatch.setattr(wire, "MAX_KEPT_NAMES", 10**9)  # the same request, its list whole
    assert _post(runtime, f"/{verb}", body) == chunked


@pytest.mark.usefixtures("small_chunks")
def test_a_chunk_that_is_not_json_or_not_names_answers_400() -> None:
    runtime = serve(NODES, [PENDING])
    names = [f"node-{i:03d}" for i in range(100)]
    body = _names_body(names).replace(b'"node-070"', b'"node-070",tru')
    status, reply = _post(runtime, "/prioritize", body)
    assert status == 400 and "not valid JSON: NodeNames, from entry " in reply["Error"]
    status, reply = _post(runtime, "/filter", _names_body([*names[:80], 7, *names[80:]]))
    assert status == 400 and "NodeNames[80]" in reply["Error"], reply
