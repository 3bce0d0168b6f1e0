"""Settings validation: each bad value names its flag and the value."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrag.errors import BadInput
from serving.config import BatcherConfig, ServerConfig, parse_sizes


@pytest.mark.parametrize(("overrides", "message"), [
    ({"max_batch_size": 0}, "field '--max-batch-size': must be >= 1, got 0"),
    ({"max_queue_delay_s": -0.001}, "field '--max-queue-delay-ms': must be >= 0 ms, got -1"),
    ({"max_queue_size": 0}, "field '--max-queue-size'"),
    ({"default_timeout_s": 0}, "field '--default-timeout-ms': must be > 0 ms"),
    ({"preferred_batch_sizes": (4, 64)}, "64 is outside 1..max batch size 32"),
    ({"preferred_batch_sizes": (4, 4)}, "duplicate sizes in [4, 4]"),
    ({"max_concurrent_batches": 0}, "field '--max-concurrent-batches'"),
])
def test_batcher_config_names_the_bad_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput) as raised:
        BatcherConfig(**overrides).validate()
    assert message in str(raised.value)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"model": ""}, "field '--model': is required"),
    ({"backend": "cuda"}, "'cuda' is not one of auto, onnxruntime, tensorrt"),
    ({"port": 70000}, "70000 is outside 0..65535"),
    ({"max_body_bytes": 0}, "field '--max-body-bytes'"),
    ({"intra_op_threads": -1}, "field '--intra-op-threads'"),
    ({"gpu_memory_growth_warn_mib": 0}, "field '--gpu-memory-growth-warn-mib'"),
    ({"shutdown_timeout_s": 0}, "field '--shutdown-timeout-s'"),
    ({"event_loop": "trio"}, "field '--event-loop': 'trio' is not one of auto, uvloop, asyncio"),
    ({"batcher": BatcherConfig(max_batch_size=-1)}, "field '--max-batch-size'"),
])
def test_server_config_names_the_bad_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(BadInput) as raised:
        ServerConfig(**{"model": "builtin:resnet-small", **overrides}).validate()
    assert message in str(raised.value)


def test_valid_configs_pass_through_unchanged() -> None:
    config = ServerConfig(model="builtin:resnet-small")
    assert config.validate() is config


@pytest.mark.parametrize(("text", "sizes"), [("", ()), ("8", (8,)), (" 4, 8 ,16,", (4, 8, 16))])
def test_parse_sizes(text: str, sizes: tuple[int, ...]) -> None:
    assert parse_sizes(text, "--x") == sizes


def test_the_growth_alarm_defaults_to_the_seeds_100_mb() -> None:
    # 100 MB is 95.37 MiB: an alarm at 100 MiB (104.9 MB) would let a 4.9 MB larger step by.
    assert ServerConfig(model="m").gpu_memory_growth_warn_mib * 2**20 == 100e6
