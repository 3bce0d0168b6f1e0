"""gpufrag.diagnose: every thread's stack, read through faulthandler, logged as JSON lines."""

from __future__ import annotations

import os
import signal
import threading

from structlog.testing import capture_logs

from gpufrag import diagnose


def _parked(ready: threading.Event, release: threading.Event) -> None:
    ready.set()
    release.wait(30)


def test_every_threads_stack_is_read_with_its_name_innermost_frame_last() -> None:
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_parked, args=(ready, release), name="parked-worker")
    thread.start()
    try:
        assert ready.wait(10)
        stacks = {s.name: s for s in diagnose.thread_stacks()}
    finally:
        release.set()
        thread.join(10)
    parked = stacks["parked-worker"]
    assert not parked.current and parked.ident == thread.ident
    assert any(f.endswith(" in _parked") for f in parked.frames)
    # innermost last: the Event's wait comes after _parked, which called it
    names = [f.rsplit(" in ", 1)[1] for f in parked.frames]
    assert names.index("_parked") < names.index("wait")
    main = stacks[threading.main_thread().name]
    assert main.current and main.frames[-1].endswith(" in thread_stacks")


def test_the_dump_parser_reads_faulthandlers_text() -> None:
    text = ('Thread 0x00007f00000000aa (most recent call first):\n'
            '  File "/x/b.py", line 9 in inner\n'
            '  File "/x/a.py", line 3 in outer\n'
            '\n'
            'Current thread 0x00007f00000000bb (most recent call first):\n'
            '  File "/x/c.py", line 1 in <module>\n')
    first, second = diagnose.parse_dump(text, {0x7f00000000aa: "worker"})
    assert (first.name, first.current, first.frames) == (
        "worker", False, ("/x/a.py:3 in outer", "/x/b.py:9 in inner"))
    assert (second.ident, second.name, second.current) == (0x7f00000000bb, "", True)


def test_sigusr1_logs_the_stacks_and_the_process_goes_on() -> None:
    previous = signal.getsignal(diagnose.DUMP_SIGNAL)
    try:
        assert diagnose.install("test")
        with capture_logs() as logs:
            os.kill(os.getpid(), diagnose.DUMP_SIGNAL)  # handled before kill returns here
        summary = [e for e in logs if e["event"] == "thread_stacks"]
        assert summary and summary[0]["threads"] == len(
            [e for e in logs if e["event"] == "thread_stack"])
    finally:
        signal.signal(diagnose.DUMP_SIGNAL, previous)


def test_install_outside_the_main_thread_installs_nothing() -> None:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(diagnose.install("test")))
    thread.start()
    thread.join(10)
    assert result == [False]
