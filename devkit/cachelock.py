"""One builder per cache entry, across processes.

The dev kit's caches (the image archives, the upstream CRDs) are filled by whoever needs them
first: the test command builds in the background while test processes that need the same entry
start. Two builders of one entry would each spend minutes on it, so the second waits for the
first and then finds the entry made. A lock file beside the entry, held with ``flock`` (the
kernel lets it go when its holder dies, so a crashed build blocks nobody).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold ``lock_path`` (made with its folder if missing) for the ``with`` block; a second
    holder waits. Check for the entry again inside the block: it may have been made while
    this caller waited."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
