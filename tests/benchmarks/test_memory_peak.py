"""benchmarks.memory_peak reads each component's limit and env from the manifests it is
judged against, and refuses an unknown case before starting anything."""

from __future__ import annotations

import pytest

from benchmarks import memory_peak
from defrag.admission.server import MAX_BODY_BYTES


def test_the_limits_and_env_are_the_manifests() -> None:
    assert memory_peak.memory_limit_mib(memory_peak.EXTENDER_MANIFEST, "extender") == 1024
    assert memory_peak.memory_limit_mib(memory_peak.WEBHOOK_MANIFEST, "admission") == 256
    for manifest, container in ((memory_peak.EXTENDER_MANIFEST, "extender"),
                                (memory_peak.WEBHOOK_MANIFEST, "admission")):
        assert memory_peak.container_env(manifest, container)["MALLOC_ARENA_MAX"] == "2"


def test_the_fuzz_bodies_fit_the_webhook_body_limit() -> None:
    assert all(len(b) <= MAX_BODY_BYTES for b in memory_peak.fuzz_bodies())


def test_an_unknown_case_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        memory_peak.main(["--cases", "filter-nodes-1,filter-everything"])
    assert exited.value.code == 2
    assert "no case ['filter-everything']" in capsys.readouterr().err
