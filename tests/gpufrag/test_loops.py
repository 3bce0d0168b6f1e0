"""gpufrag/loops.py: which event loop ``gpufrag serve`` (and the extender) picks, and the
errors when it can't."""

from __future__ import annotations

import asyncio

import pytest

from gpufrag import loops
from gpufrag.errors import BadInput
from gpufrag.loops import loop_factory, resolve_event_loop, running_loop_kind


def test_auto_picks_uvloop_when_installed_and_asyncio_stays_asyncio() -> None:
    assert loops.uvloop_available()  # a dependency of the package on Linux
    assert resolve_event_loop("auto") == "uvloop"
    assert resolve_event_loop("asyncio") == "asyncio"
    assert resolve_event_loop("uvloop") == "uvloop"


def test_without_uvloop_auto_falls_back_and_asking_for_it_names_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loops, "uvloop", None)
    assert resolve_event_loop("auto") == "asyncio"
    with pytest.raises(BadInput, match="field '--event-loop': uvloop is not installed.*"
                                       "--event-loop asyncio"):
        resolve_event_loop("uvloop")


def test_an_unknown_loop_is_refused_by_name() -> None:
    with pytest.raises(BadInput, match="'trio' is not one of auto, uvloop, asyncio"):
        resolve_event_loop("trio")


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_the_factory_makes_the_loop_it_names(kind: str) -> None:
    async def which() -> str:
        return running_loop_kind()

    with asyncio.Runner(loop_factory=loop_factory(kind)) as runner:
        assert runner.run(which()) == kind


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_a_wrapping_loop_hands_each_listener_to_its_wrap_first(choice: str) -> None:
    """What gpufrag.connlimit stands on: asyncio.start_server (how an asyncio server listens)
    reaches the wrap with its protocol factory, and the connections it accepts are made by
    the factory the wrap returns."""
    seen: list[loops.TLSStart | None] = []
    made: list[asyncio.BaseProtocol] = []

    def wrap(factory: loops.ProtocolFactory, tls: loops.TLSStart | None
             ) -> loops.ProtocolFactory:
        seen.append(tls)

        def wrapped() -> asyncio.BaseProtocol:
            made.append(factory())
            return made[-1]

        return wrapped

    async def connect_once() -> str:
        served = asyncio.Event()

        async def on_connection(_reader: asyncio.StreamReader,
                                writer: asyncio.StreamWriter) -> None:
            served.set()
            writer.close()

        server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await served.wait()
        writer.close()
        server.close()
        await server.wait_closed()
        return running_loop_kind()

    with asyncio.Runner(loop_factory=lambda: loops.new_event_loop(server_wrap=wrap,
                                                                  choice=choice)) as runner:
        assert runner.run(connect_once()) == choice
    assert seen == [None]  # plain TCP: no TLS to begin
    assert len(made) == 1 and isinstance(made[0], asyncio.StreamReaderProtocol)
