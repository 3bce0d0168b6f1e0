"""What the node daemons' one-process CLI tests share: a one-GPU recording, a readiness wait."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from devkit.procs import wait_until

A100_UUID = "GPU-00000000-0000-4000-8000-000000000000"


def one_gpu_recording(path: Path, **extra: object) -> Path:
    """An NVML recording of one A100 80GB (``extra``: top-level fields such as init_error)."""
    path.write_text(json.dumps({**extra, "devices": [
        {"name": "NVIDIA A100-SXM4-80GB", "uuid": A100_UUID, "memory_total": 85_899_345_920,
         "samples": [{"gpu": 0, "memory_used": 0}]}]}))
    return path


def ready_within(url: str, deadline: float) -> bool:
    """Whether ``url`` answers 200 before ``deadline`` (monotonic): the daemon's readiness
    probe, polled through the dev kit's one wait (a 503 or a refused connection until ready)."""

    def ready() -> bool:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)

    try:
        wait_until(ready, timeout_s=max(0.0, deadline - time.monotonic()),
                   what=f"{url} to answer 200", interval_s=0.05)
    except TimeoutError:
        return False
    return True
