"""Settings for the batcher and the server: frozen dataclasses validated once, at load.

Every knob has a unit in its name and a default that matches Triton's dynamic batcher where one
exists. ``validate()`` raises :class:`gpufrag.errors.BadInput` naming the exact CLI flag and the
bad value, so the hot path never re-checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpufrag.errors import BadInput
from gpufrag.loops import EVENT_LOOPS

BACKENDS = ("auto", "onnxruntime", "tensorrt")


# The seed's leak alarm: GPU memory grown by more than 100 MB across one batch. 100 MB, not
# 100 MiB: 95.37 MiB.
GROWTH_WARN_MIB = 100e6 / 2**20


@dataclass(frozen=True)
class BatcherConfig:
    """How requests are grouped into batches (Triton ``dynamic_batching`` semantics).

    A batch is sent when it reaches ``max_batch_size`` rows or one of ``preferred_batch_sizes``,
    or when the oldest queued request has waited ``max_queue_delay_s`` since *its* enqueue.
    """

    max_batch_size: int = 32
    max_queue_delay_s: float = 0.005
    max_queue_size: int = 1024
    default_timeout_s: float = 30.0
    preferred_batch_sizes: tuple[int, ...] = ()
    max_concurrent_batches: int = 1
    retry_after_s: int = 1

    def validate(self) -> BatcherConfig:
        _positive_int(self.max_batch_size, "--max-batch-size")
        if not self.max_queue_delay_s >= 0:
            raise BadInput(f"must be >= 0 ms, got {self.max_queue_delay_s * 1000:g}",
                           field="--max-queue-delay-ms")
        _positive_int(self.max_queue_size, "--max-queue-size")
        if not self.default_timeout_s > 0:
            raise BadInput(f"must be > 0 ms, got {self.default_timeout_s * 1000:g}",
                           field="--default-timeout-ms")
        for size in self.preferred_batch_sizes:
            if not 1 <= size <= self.max_batch_size:
                raise BadInput(f"{size} is outside 1..max batch size {self.max_batch_size}",
                               field="--preferred-batch-sizes")
        if len(set(self.preferred_batch_sizes)) != len(self.preferred_batch_sizes):
            raise BadInput(f"duplicate sizes in {list(self.preferred_batch_sizes)}",
                           field="--preferred-batch-sizes")
        _positive_int(self.max_concurrent_batches, "--max-concurrent-batches")
        _positive_int(self.retry_after_s, "--retry-after-s")
        return self


@dataclass(frozen=True)
class ServerConfig:
    """The process: which model, which backend, where to listen, limits on input."""

    model: str
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    model_name: str | None = None
    backend: str = "auto"
    model_cache_dir: Path | None = None
    engine_cache_dir: Path | None = None
    host: str = "0.0.0.0"
    port: int = 8000
    max_body_bytes: int = 64 * 1024 * 1024
    intra_op_threads: int = 0
    gpu_memory_growth_warn_mib: float = GROWTH_WARN_MIB
    shutdown_timeout_s: float = 30.0
    # After SIGTERM: readiness is 503 at once but requests are still admitted and answered for
    # this long, so the endpoint is removed from Services/load balancers before admission closes.
    drain_delay_s: float = 5.0
    # Inputs whose requests may carry NaN/+-Inf (see TensorSpec.allow_non_finite); checked
    # against the model's inputs once it is loaded (serving.server.published_inputs).
    allow_non_finite_inputs: tuple[str, ...] = ()
    # auto = uvloop when installed, else asyncio's own loop (gpufrag/loops.py)
    event_loop: str = "auto"
    # The opt-in debug listener (gpufrag.memdebug: allocation growth by site), on loopback;
    # 0: off, and nothing is traced.
    debug_port: int = 0

    def validate(self) -> ServerConfig:
        if not self.model:
            raise BadInput("is required: a path to an .onnx file or builtin:NAME",
                           field="--model")
        self.batcher.validate()
        if self.backend not in BACKENDS:
            raise BadInput(f"{self.backend!r} is not one of {', '.join(BACKENDS)}",
                           field="--backend")
        if not 0 <= self.port <= 65535:
            raise BadInput(f"{self.port} is outside 0..65535", field="--port")
        if not 0 <= self.debug_port <= 65535:
            raise BadInput(f"{self.debug_port} is outside 0..65535 (0: off)",
                           field="--debug-port")
        if self.debug_port and self.debug_port == self.port:
            raise BadInput(f"{self.debug_port} is --port too; the debug listener needs its own",
                           field="--debug-port")
        _positive_int(self.max_body_bytes, "--max-body-bytes")
        if self.intra_op_threads < 0:
            raise BadInput(f"must be >= 0 (0 = runtime default), got {self.intra_op_threads}",
                           field="--intra-op-threads")
        if not self.gpu_memory_growth_warn_mib > 0:
            raise BadInput(f"must be > 0, got {self.gpu_memory_growth_warn_mib:g}",
                           field="--gpu-memory-growth-warn-mib")
        if not self.shutdown_timeout_s > 0:
            raise BadInput(f"must be > 0, got {self.shutdown_timeout_s:g}",
                           field="--shutdown-timeout-s")
        if not self.drain_delay_s >= 0:
            raise BadInput(f"must be >= 0, got {self.drain_delay_s:g}", field="--drain-delay-s")
        if self.event_loop not in EVENT_LOOPS:
            raise BadInput(f"{self.event_loop!r} is not one of {', '.join(EVENT_LOOPS)}",
                           field="--event-loop")
        for name in self.allow_non_finite_inputs:
            if not name.strip():
                raise BadInput("needs an input name, got an empty one",
                               field="--allow-non-finite")
        return self


def _positive_int(value: int, flag: str) -> None:
    if value < 1:
        raise BadInput(f"must be >= 1, got {value}", field=flag)


def parse_sizes(text: str, flag: str) -> tuple[int, ...]:
    """``"4,8,16"`` -> (4, 8, 16); empty -> (); anything else names the flag and the bad item."""
    sizes: list[int] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            sizes.append(int(item))
        except ValueError:
            raise BadInput(f"{item!r} is not an integer (expected e.g. 4,8,16)",
                           field=flag) from None
    return tuple(sizes)
