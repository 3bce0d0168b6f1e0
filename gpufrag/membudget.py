"""How much memory a request may make a process hold: a cost read off a JSON body before it is
parsed, and a budget that such costs are reserved from.

Why: a component's memory limit is for all its requests together, and what a request costs
is not its body but what is built from it. Parsed into Python objects, JSON takes 3x its size
for Node objects as kube-scheduler sends them and up to 21x for the worst text (``[{},{},
...]``: 64 bytes per 3), so a body that is well within the body limit can, alone or beside a
few others, take a process past its container's limit. A server that refuses or queues a
request by what it will cost keeps every peak under the budget, whatever is sent.

- :func:`parse_cost`: an upper bound on what parsing a body holds, from a count of its
  commas, colons, braces and brackets (C speed: about 2 ms a MB), never from parsing it;
  :func:`worst_cost`: the most that can be for a body's size, with no count at all.
- :class:`MemoryBudget`: costs reserved and released; a reservation waits (up to ``wait_s``)
  while others hold the room it needs and is refused when it could never fit
  (:class:`OverBudget`: answer 413) or did not get room in time (:class:`BudgetBusy`: answer
  503 with ``Retry-After``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

# Bytes each JSON value costs once parsed (CPython 3.11 and orjson, measured with
# tracemalloc: tests/gpufrag/test_membudget.py): a string, number or list entry (object
# header, allocator rounding, the list's slot) at most PER_VALUE_BYTES; a dict with its key
# table PER_OBJECT_BYTES (the item {"metadata":{"name":"a"}}, two dicts and a string, costs
# 427 bytes); a list PER_ARRAY_BYTES.
PER_VALUE_BYTES = 64
PER_OBJECT_BYTES = 192
PER_ARRAY_BYTES = 64
# Each key of an object (one a colon) takes a slot of its dict's table, and a string of its
# own when it is not one orjson keeps (it keeps short keys it has seen: a Node's repeat).
PER_KEY_BYTES = 48
# Text: one byte a character when the body is ASCII; a string holding one character beyond
# Latin-1 takes up to 4 bytes for each of its characters.
WIDE_TEXT = 4
# parse_cost of any body is at most this many bytes per byte of it, plus one object and one
# value (the worst is ``{},`` over and over: a dict and a slot per 3 bytes, 85, plus wide
# text), so a cost can be bounded by the body's size alone where scanning it would cost more
# than the bound's slack: worst_cost.
WORST_BYTES_PER_BYTE = 96


def parse_cost(body: bytes | bytearray | memoryview, start: int = 0,
               end: int | None = None) -> int:
    """An upper bound on the bytes parsing ``body`` (or the part of it from ``start`` to
    ``end``, counted in place) as JSON holds beside the body itself.

    Every value but the last of a container is followed by a comma, so commas + 1 bound the
    values; each colon follows a key, each brace and bracket opens a container (a colon,
    brace or bracket inside a string is counted too: the bound only grows). Measured against
    orjson's parse it is 1.2-1.5x over for real requests (5,000 Nodes as a kubelet writes
    them, a 52 MiB body: 254 MiB for 169; 3.5M node names: 264 for 215) and 4x for the worst
    text (``[{},{},...]``, a 3 MiB body: 259 MiB for 61); tests/gpufrag/test_membudget.py
    holds it to a table of such bodies."""
    data = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    end = len(data) if end is None else end
    text = max(0, end - start) * (1 if data.isascii() else WIDE_TEXT)
    return (text + PER_VALUE_BYTES * (data.count(b",", start, end) + 1)
            + PER_KEY_BYTES * data.count(b":", start, end)
            + PER_OBJECT_BYTES * data.count(b"{", start, end)
            + PER_ARRAY_BYTES * data.count(b"[", start, end))


def worst_cost(size: int) -> int:
    """The most :func:`parse_cost` can be for a body of ``size`` bytes, without reading it."""
    return WORST_BYTES_PER_BYTE * size + PER_OBJECT_BYTES + PER_VALUE_BYTES


class OverBudget(Exception):
    """A cost over the whole budget: the request can never be served (answer 413)."""

    def __init__(self, cost: int, total: int, setting: str) -> None:
        super().__init__(f"the request would take about {_mib(cost)} MiB of memory to answer, "
                         f"more than the {_mib(total)} MiB all requests may hold together "
                         f"({setting}); send a smaller one")
        self.cost = cost
        self.total = total


class BudgetBusy(Exception):
    """Other requests hold the room a cost needs (answer 503 with ``Retry-After``)."""

    def __init__(self, cost: int, waited_s: float) -> None:
        super().__init__(f"other requests hold the memory this one needs (about {_mib(cost)} "
                         f"MiB); waited {waited_s:g} s, retry shortly")
        self.cost = cost


def _mib(size: int) -> str:
    return f"{size / 2**20:.0f}"


class MemoryBudget:
    """``total_bytes`` that requests reserve their costs from (thread-safe)."""

    def __init__(self, total_bytes: int, *, wait_s: float, setting: str = "the memory budget",
                 clock: Callable[[], float] = time.monotonic) -> None:
        if total_bytes < 1:
            raise ValueError(f"a memory budget is at least 1 byte, got {total_bytes}")
        self.total_bytes = total_bytes
        self.wait_s = wait_s
        self.setting = setting
        self._clock = clock
        self._held = 0
        self._room = threading.Condition()

    @property
    def held_bytes(self) -> int:
        """Bytes reserved now."""
        return self._held

    def reserve(self, cost: int) -> Reservation:
        """``cost`` bytes, once they fit beside what is held, within ``wait_s``.
        :class:`OverBudget` when they never can; :class:`BudgetBusy` when they did not in
        time."""
        cost = max(0, cost)
        self.take(cost, wait_s=self.wait_s)
        return Reservation(self, cost)

    def charge(self, cost: int) -> Reservation:
        """``cost`` bytes counted at once, room or not (:class:`OverBudget` only when they
        could never fit): for a request that must not wait (one answered on an event loop's
        thread, which would stall every other), so that the ones that can wait do, until it
        is done."""
        cost = max(0, cost)
        if cost > self.total_bytes:
            raise OverBudget(cost, self.total_bytes, self.setting)
        with self._room:
            self._held += cost
        return Reservation(self, cost, charged=True)

    def take(self, cost: int, *, wait_s: float) -> None:
        """``cost`` bytes held, without a :class:`Reservation` to give them back: for
        :meth:`Reservation.grow`, and :meth:`give_back` for its release."""
        if cost > self.total_bytes:
            raise OverBudget(cost, self.total_bytes, self.setting)
        with self._room:
            if not self._room.wait_for(lambda: self._held + cost <= self.total_bytes,
                                       timeout=wait_s):
                raise BudgetBusy(cost, wait_s)
            self._held += cost

    def give_back(self, cost: int) -> None:
        """``cost`` bytes that :meth:`take` held, free again."""
        with self._room:
            self._held -= cost
            self._room.notify_all()


class Reservation:
    """Bytes reserved from a :class:`MemoryBudget`, given back by :meth:`release` (or at the
    end of a ``with`` block), once."""

    def __init__(self, budget: MemoryBudget, cost: int, *, charged: bool = False) -> None:
        self.budget = budget
        self.cost = cost
        self.charged = charged  # made by MemoryBudget.charge: grows the same way

    def grow(self, more: int) -> None:
        """``more`` bytes on top, as :meth:`MemoryBudget.reserve` would (:class:`OverBudget`
        when the whole would never fit, :class:`BudgetBusy` when no room came in time; a
        charged reservation is charged the more). Two requests that each wait to grow while
        holding what the other needs are both refused once the wait runs out, never stuck:
        reserve as much as can be known up front."""
        if more <= 0:
            return
        total = self.cost + more
        if total > self.budget.total_bytes:
            raise OverBudget(total, self.budget.total_bytes, self.budget.setting)
        if self.charged:
            self.budget.charge(more).cost = 0  # counted on this reservation instead
        else:
            self.budget.take(more, wait_s=self.budget.wait_s)
        self.cost = total

    def shrink(self, to: int) -> None:
        """Keep only ``to`` bytes (what is still held: an answer being sent, once what it
        was built from is gone)."""
        extra = self.cost - max(0, to)
        if extra > 0:
            self.cost -= extra
            self.budget.give_back(extra)

    def release(self) -> None:
        cost, self.cost = self.cost, 0
        if cost:
            self.budget.give_back(cost)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()


__all__ = ["PER_ARRAY_BYTES", "PER_KEY_BYTES", "PER_OBJECT_BYTES", "PER_VALUE_BYTES",
           "WORST_BYTES_PER_BYTE", "BudgetBusy",
           "MemoryBudget", "OverBudget", "Reservation", "parse_cost", "worst_cost"]
