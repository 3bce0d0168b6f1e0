"""The gateway holds a body once and an answer once: the body is written into one buffer that
the app reads whole without a copy, the app's answer pieces are sent one after the other
without being joined, and the answer's ``close`` runs once it is sent (PEP 3333)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpufrag.httpserve import Gateway, Limits

PIECES = [b"a" * 10, b"b" * 20, b"c"]


class Answer:
    """A WSGI answer in pieces that records when it is closed."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def __iter__(self) -> Iterator[bytes]:
        return iter(PIECES)

    def close(self) -> None:
        self.events.append("closed")


def _scope(length: int) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/x", "raw_path": b"/x",
            "query_string": b"", "http_version": "1.1", "scheme": "http",
            "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 5000),
            "headers": [(b"content-length", str(length).encode())]}


def _exchange(app: Callable[..., Any], chunks: list[bytes],
              events: list[str]) -> list[dict[str, Any]]:
    """The messages the gateway sends for one request whose body comes in ``chunks``."""
    sent: list[dict[str, Any]] = []
    incoming = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        events.append(message["type"])

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            gateway = Gateway(app, Limits(max_body_bytes=1024), pool)
            await gateway(_scope(sum(map(len, chunks))), receive, send)

    asyncio.run(main())
    return sent


def test_the_body_is_read_whole_without_a_copy_and_the_answer_sent_in_its_pieces() -> None:
    events: list[str] = []
    seen: list[bool] = []

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Answer:
        stream = environ["wsgi.input"]
        assert isinstance(stream, io.BytesIO)
        body = stream.read(int(environ["CONTENT_LENGTH"]))
        seen.append(body == b"abcdefghi" and body is stream.getvalue())  # its very buffer
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return Answer(events)

    sent = _exchange(app, [b"abc", b"def", b"ghi"], events)
    assert seen == [True]
    assert [m.get("body") for m in sent[1:]] == PIECES  # not joined
    assert [m.get("more_body") for m in sent[1:]] == [True, True, False]
    assert events == ["http.response.start", *["http.response.body"] * 3, "closed"]


def test_an_app_that_fails_midway_is_closed_and_answered_500() -> None:
    events: list[str] = []

    class Failing(Answer):
        def __iter__(self) -> Iterator[bytes]:
            yield b"partial"
            raise RuntimeError("bug")

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Answer:
        start_response("200 OK", [])
        return Failing(events)

    sent = _exchange(app, [b"x"], events)
    assert sent[0]["status"] == 500 and events[0] == "closed"
    assert events.count("closed") == 1
