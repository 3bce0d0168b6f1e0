"""Each GPU of an inspection split into used, reserved-but-idle, reserved-with-no-reading and
free, in GPUs: what the summary adds up and the picture draws, from one rule.

The input is ``gpufrag inspect``'s own document (:func:`defrag.controller.inspect.view`), so
the split reads the same figures the per-node table prints: a GPU's free share and its memory
at its peak over the window, on a GPU with a fresh agent reading. Reserved-but-idle is the
defrag trigger's idle memory (DESIGN.md: reserved minus peak use over the window, floored at
0) on that GPU, so a node's GPUs add up to the node's ``idle_mib`` in that document; a GPU with
no fresh reading is not guessed at: its reserved share is its own category, as the trigger
leaves such a GPU out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from scheduler.core.types import MILLI_PER_GPU

USED, IDLE, UNREAD, FREE = range(4)
PARTS: Final = ("used", "reserved but idle", "reserved, no reading", "free")


def node_split(node: Mapping[str, Any]) -> npt.NDArray[np.float64]:
    """[GPU, part] -> the GPU's share in each part (each row sums to 1), for one node of
    inspect's document."""
    gpus: Sequence[Mapping[str, Any]] = node["gpus"]
    out = np.zeros((len(gpus), len(PARTS)))
    memory = float(node["gpu_memory_mib"])
    for i, gpu in enumerate(gpus):
        free = min(max(int(gpu["free_milli"]), 0), MILLI_PER_GPU) / MILLI_PER_GPU
        reserved = 1.0 - free
        out[i, FREE] = free
        peak = gpu["peak_mib"]
        if peak is None:
            out[i, UNREAD] = reserved
        elif memory <= 0:  # no memory size known: nothing can be called idle
            out[i, USED] = reserved
        else:
            out[i, USED] = min(float(peak) / memory, reserved)
            out[i, IDLE] = reserved - out[i, USED]
    return out


def fleet_split(nodes: Sequence[Mapping[str, Any]]) -> list[npt.NDArray[np.float64]]:
    """:func:`node_split` of every node, in the document's order."""
    return [node_split(n) for n in nodes]
