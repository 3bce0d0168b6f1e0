"""Online diagnosis without a restart: every thread's stack on ``SIGUSR1``, as JSON log lines.

A long-running component that seems stuck or slow (a filter that takes seconds, an agent that
stopped publishing) is asked where each of its threads is: ``kill -USR1 <pid>`` (or
``kubectl exec ... -- kill -USR1 1``) logs one ``thread_stack`` line per thread, with its name,
its id and its frames innermost last, then one ``thread_stacks`` summary line, and the process
goes on serving. The stacks are walked by :func:`faulthandler.dump_traceback` (the
interpreter's own C-level walk of every thread, public API) into a temporary file and parsed
back, so no private interpreter structure is read.

The handler runs in the main thread between bytecodes, as every Python signal handler does: a
main thread busy in Python or waiting in the event loop answers at once; one blocked inside a
single C call answers when that call returns. Who may call it: only a process that may signal
this one (the same user, or root on the node; in a pod, whoever may ``kubectl exec``).
"""

from __future__ import annotations

import faulthandler
import re
import signal
import tempfile
import threading
from dataclasses import dataclass

import structlog
from structlog.typing import FilteringBoundLogger

DUMP_SIGNAL = signal.SIGUSR1
MAX_DUMP_BYTES = 4 * 1024 * 1024  # faulthandler caps frames and threads; this caps the read

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<function>.*)$')


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's stack, innermost frame last (the order of a Python traceback)."""

    ident: int
    name: str
    current: bool
    frames: tuple[str, ...]  # "file:line in function"


def parse_dump(text: str, names: dict[int, str]) -> list[ThreadStack]:
    """:func:`faulthandler.dump_traceback`'s text as stacks; ``names``: thread id -> name.

    faulthandler lists the innermost frame first; the stacks here read like tracebacks."""
    stacks: list[ThreadStack] = []
    ident, current = 0, False
    frames: list[str] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head is not None:
            if ident:
                stacks.append(ThreadStack(ident, names.get(ident, ""), current,
                                          tuple(reversed(frames))))
            ident, current, frames = int(head.group(2), 16), head.group(1) != "Thread", []
            continue
        frame = _FRAME.match(line)
        if frame is not None and ident:
            frames.append(f"{frame['file']}:{frame['line']} in {frame['function']}")
    if ident:
        stacks.append(ThreadStack(ident, names.get(ident, ""), current, tuple(reversed(frames))))
    return stacks


def thread_stacks() -> list[ThreadStack]:
    """Every thread's stack now."""
    with tempfile.TemporaryFile(mode="w+b") as dump:
        faulthandler.dump_traceback(file=dump, all_threads=True)
        dump.seek(0)
        text = dump.read(MAX_DUMP_BYTES).decode("utf-8", "replace")
    names = {t.ident: t.name for t in threading.enumerate() if t.ident is not None}
    return parse_dump(text, names)


def log_stacks(log: FilteringBoundLogger) -> int:
    """Log every thread's stack (one line each, then a summary); the number of threads."""
    stacks = thread_stacks()
    for stack in stacks:
        log.warning("thread_stack", thread=stack.name or hex(stack.ident), ident=stack.ident,
                    current=stack.current, frames=list(stack.frames))
    log.warning("thread_stacks", threads=len(stacks), signal=DUMP_SIGNAL.name)
    return len(stacks)


def install(component: str) -> bool:
    """Log every thread's stack on ``SIGUSR1`` from now on; False (nothing installed) when not
    called from the main thread, where alone Python may set a signal handler."""
    if threading.current_thread() is not threading.main_thread():
        return False
    log = structlog.get_logger(f"gpufrag.{component}").bind(component=component)

    def dump(_signum: int, _frame: object) -> None:
        try:
            log_stacks(log)
        except Exception as e:  # a diagnosis must never take the component down
            log.error("thread_stacks_failed", error=f"{type(e).__name__}: {e}")

    signal.signal(DUMP_SIGNAL, dump)
    return True
