"""Each pod's peak GPU memory over a window, per GPU: what the agent publishes as ``peak_mib``
beside the current figure, so the defrag trigger reads memory reserved and not touched over
the window rather than what happens to be unused at one instant (DESIGN.md).

Kept in buckets of ``bucket_s`` (an hour by default): the peak of each bucket that overlaps
the window, so memory stays bounded (a week is 168 numbers per pod and GPU) and an old peak
leaves the window a bucket at a time. Pods no longer in a reading are forgotten.
"""

from __future__ import annotations

import dataclasses
import math

from gpufrag.gpu_usage import GpuUsage, NodeGpuUsage, PodGpuUsage

# The recommender's window (defrag.rightsizing.RightsizingConfig.window_s) and interval.
DEFAULT_WINDOW_S = 7 * 86400.0
DEFAULT_BUCKET_S = 3600.0

_Key = tuple[str, int]  # (pod uid, GPU index)


@dataclasses.dataclass
class _Seen:
    first_s: float
    buckets: dict[float, int]


class PeakWindow:
    """Folds each reading in and fills its pods' ``peak_mib`` and ``peak_since``."""

    def __init__(self, window_s: float = DEFAULT_WINDOW_S,
                 bucket_s: float = DEFAULT_BUCKET_S) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"window_s must be a positive number of seconds, got {window_s}")
        if not (math.isfinite(bucket_s) and 0 < bucket_s <= window_s):
            raise ValueError(f"bucket_s must be in (0, window_s], got {bucket_s}")
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._seen: dict[_Key, _Seen] = {}

    def observe(self, usage: NodeGpuUsage) -> NodeGpuUsage:
        """``usage`` with every pod's peak over the window (this reading included)."""
        now = usage.timestamp
        oldest = now - self.window_s
        bucket = math.floor(now / self.bucket_s) * self.bucket_s
        present: set[_Key] = set()
        gpus: list[GpuUsage] = []
        for gpu in usage.gpus:
            pods: list[PodGpuUsage] = []
            for pod in gpu.pods:
                key = (pod.uid, gpu.index)
                present.add(key)
                seen = self._seen.get(key)
                if seen is None:
                    seen = self._seen[key] = _Seen(now, {})
                seen.buckets[bucket] = max(seen.buckets.get(bucket, 0), pod.memory_used_mib)
                for start in [b for b in seen.buckets if b + self.bucket_s <= oldest]:
                    del seen.buckets[start]
                pods.append(dataclasses.replace(
                    pod, peak_mib=max(seen.buckets.values()),
                    peak_since=round(max(seen.first_s, oldest), 3)))
            gpus.append(dataclasses.replace(gpu, pods=tuple(pods)))
        for key in [k for k in self._seen if k not in present]:
            del self._seen[key]
        return dataclasses.replace(usage, gpus=tuple(gpus))


__all__ = ["DEFAULT_BUCKET_S", "DEFAULT_WINDOW_S", "PeakWindow"]
