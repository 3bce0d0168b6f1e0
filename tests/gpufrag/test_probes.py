"""The node-side probes: a stall-based liveness and the three routes."""

from __future__ import annotations

from gpufrag.probes import Liveness, respond


def test_alive_until_the_first_tick_then_stalled_after_the_deadline() -> None:
    now = [100.0]
    liveness = Liveness(lambda: now[0], stall_after_s=10)
    assert liveness.live()
    liveness.tick()
    now[0] = 110.0
    assert liveness.live()
    now[0] = 110.5
    assert not liveness.live()
    liveness.tick(now=110.5)
    assert liveness.live()


def test_a_call_stuck_past_its_bound_fails_liveness_while_the_loop_ticks() -> None:
    """Liveness reflects the work: a ticking supervisor loop does not make a component whose
    request path is stuck (a deadlock, a call that never returns) look alive."""
    now = [100.0]
    liveness = Liveness(lambda: now[0], stall_after_s=10, stuck_after_s=30)
    with liveness.working("Allocate (nvidia.com/gpu)"):
        now[0] += 30
        liveness.tick()
        assert liveness.live()
        now[0] += 1
        liveness.tick()
        assert not liveness.live()
        assert liveness.why_not_live() == "Allocate (nvidia.com/gpu) in progress for 31s " \
                                          "(bound 30s)"
    assert liveness.live() and liveness.why_not_live() == ""  # the call came back


def test_routes_say_what_the_component_waits_for() -> None:
    def answer(path: str, live: bool, ready: bool) -> tuple[int, bytes]:
        status, _, body = respond(path, lambda: b"m 1\n", lambda: live, lambda: ready,
                                  stalled="stalled: x", not_ready="not ready: y")
        return status, body

    assert answer("/metrics?x=1", False, False) == (200, b"m 1\n")
    assert answer("/healthz", True, False) == (200, b"ok\n")
    assert answer("/healthz", False, True) == (503, b"stalled: x\n")
    assert answer("/readyz", True, True) == (200, b"ready\n")
    assert answer("/readyz", True, False) == (503, b"not ready: y\n")
    assert answer("/other", True, True)[0] == 404
