"""What the node daemons' one-process CLI tests share: a one-GPU recording, a readiness wait."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

A100_UUID = "GPU-00000000-0000-4000-8000-000000000000"


def one_gpu_recording(path: Path, **extra: object) -> Path:
    """An NVML recording of one A100 80GB (``extra``: top-level fields such as init_error)."""
    path.write_text(json.dumps({**extra, "devices": [
        {"name": "NVIDIA A100-SXM4-80GB", "uuid": A100_UUID, "memory_total": 85_899_345_920,
         "samples": [{"gpu": 0, "memory_used": 0}]}]}))
    return path


def ready_within(url: str, deadline: float) -> bool:
    """Poll ``url`` until it answers 200 or ``deadline`` (monotonic) passes."""
    while True:
        try:
            if urllib.request.urlopen(url, timeout=5).status == 200:
                return True
        except OSError:  # 503 (HTTPError) until ready, or not listening yet
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
