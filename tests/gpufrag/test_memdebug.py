"""The opt-in debug listener's allocation report (gpufrag.memdebug), on loopback only."""

from __future__ import annotations

import tracemalloc

import orjson
import requests

from gpufrag.memdebug import LOOPBACK, AllocationTracer, answer, start_debug_listener

HELD: list[bytes] = []


def grow(blocks: int) -> None:
    for i in range(blocks):
        HELD.append(bytes(64 * 1024) + i.to_bytes(4, "little"))  # the site the report names


def test_the_report_names_the_line_that_grew_and_by_how_much() -> None:
    tracer = AllocationTracer()
    try:
        grow(64)  # 4 MiB
        report = tracer.report()
        top = report["top_growth"][0]
        assert any(f"{__file__}:" in frame for frame in top["traceback"]), top
        assert top["growth_bytes"] >= 64 * 64 * 1024 and top["growth_blocks"] >= 64
        assert report["traced_bytes"] >= top["growth_bytes"]
        assert report["traced_peak_bytes"] >= report["traced_bytes"]
        assert len(report["top_growth"]) <= 25
    finally:
        tracer.close()
        HELD.clear()
    assert not tracemalloc.is_tracing()  # off again once the tracer that started it closes


def test_only_its_path_is_served() -> None:
    tracer = AllocationTracer()
    try:
        status, _, body = answer("/debug/memory", tracer, lambda: {"gpu": "none"})
        assert status == 200 and orjson.loads(body)["gpu"] == "none"
        status, _, body = answer("/debug/pprof", tracer, dict)
        assert status == 404 and b"/debug/memory" in body
    finally:
        tracer.close()


def test_the_listener_binds_loopback_and_answers_json() -> None:
    listener = start_debug_listener(0, lambda: {"extra": 1})
    try:
        assert listener.server.host == LOOPBACK
        reply = requests.get(f"http://{LOOPBACK}:{listener.port}/debug/memory", timeout=10)
        assert reply.status_code == 200
        assert reply.headers["Content-Type"] == "application/json"
        data = reply.json()
        assert data["extra"] == 1 and isinstance(data["top_growth"], list)
        assert requests.post(f"http://{LOOPBACK}:{listener.port}/debug/memory",
                             timeout=10).status_code == 405
    finally:
        listener.stop()
    assert not tracemalloc.is_tracing()
