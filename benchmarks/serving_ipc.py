"""What a multi-process front end would add per request: a decoded tensor handed from an HTTP
front-end process to the one batcher process, and the answer handed back.

The design measured: several acceptor processes on one port (``SO_REUSEPORT``) parse HTTP and
decode tensors, and pass each request to a single batcher process (one batcher, so batches
still fill from every connection). Two ways of passing it, each a round trip per request:

- **pipe**: the tensor's bytes written to a ``multiprocessing`` pipe, the answer read back;
- **shared memory**: the tensor copied into a slot of a shared-memory ring, only the slot's
  index sent over the pipe (the batcher would read the slot in place when assembling).

The figure is the CPU of both processes per round trip (user + system, including the wake-ups
a real design pays), measured over many round trips with the batcher side answering at once.
It is what each request would cost *on top of* today's single-process path, on the same
cores; the benchmark prints it next to the event loop's whole cost per request.
"""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory

SLOTS = 64


@dataclass(frozen=True)
class HandoffCost:
    pipe_us: float
    shm_us: float


def _batcher_side(conn: Connection, shm_name: str | None, slot_bytes: int,
                  answer_bytes: int) -> None:
    """Echo an answer per request (pipe: bytes in; shared memory: a slot index in)."""
    answer = bytes(answer_bytes)
    shm = SharedMemory(name=shm_name) if shm_name is not None else None
    view = shm.buf if shm is not None else None
    try:
        while True:
            message = conn.recv_bytes()
            if message == b"stop":
                break
            if view is not None:  # touch the slot as assembly would (one read of its bytes)
                slot = int.from_bytes(message, "little")
                bytes(view[slot * slot_bytes:(slot + 1) * slot_bytes])
            conn.send_bytes(answer)
        conn.send_bytes(str(os.times().user + os.times().system).encode())
    finally:
        del view
        if shm is not None:
            shm.close()


def _round_trips(nbytes: int, answer_bytes: int, *, use_shm: bool, count: int) -> float:
    parent, child = multiprocessing.Pipe()
    shm = SharedMemory(create=True, size=SLOTS * nbytes) if use_shm else None
    context = multiprocessing.get_context("fork")
    process = context.Process(target=_batcher_side,
                              args=(child, shm.name if shm else None, nbytes, answer_bytes))
    process.start()
    tensor = bytes(nbytes)
    view = shm.buf if shm is not None else None
    try:
        before = os.times()
        for i in range(count):
            if view is not None:
                slot = i % SLOTS
                view[slot * nbytes:(slot + 1) * nbytes] = tensor
                parent.send_bytes(slot.to_bytes(4, "little"))
            else:
                parent.send_bytes(tensor)
            parent.recv_bytes()
        after = os.times()
        parent.send_bytes(b"stop")
        child_cpu = float(parent.recv_bytes())
        process.join(timeout=10)
    finally:
        del view
        if shm is not None:
            shm.close()
            shm.unlink()
    own = (after.user - before.user) + (after.system - before.system)
    return 1e6 * (own + child_cpu) / count


def handoff_cost(nbytes: int, *, answer_bytes: int, count: int = 10_000) -> HandoffCost:
    """CPU microseconds per request handed to another process and answered, both ways
    (``os.times`` ticks are 10 ms, so ``count`` round trips are timed together)."""
    return HandoffCost(
        pipe_us=_round_trips(nbytes, answer_bytes, use_shm=False, count=count),
        shm_us=_round_trips(nbytes, answer_bytes, use_shm=True, count=count))
