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
