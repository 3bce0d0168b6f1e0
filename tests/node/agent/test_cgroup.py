from __future__ import annotations

from pathlib import Path

import pytest

from node.agent.cgroup import (
    PodDirectory,
    PodListError,
    PodRecord,
    PodRef,
    PodResolver,
    PodShare,
    pod_uid_for_pid,
    pod_uid_from_cgroup,
)
from scheduler.core.types import PodRequest
from tests.node.agent.fakes import (
    FakeClock,
    FakeLister,
    RecordingLog,
)

UID = "7a1d2b3c-4e5f-6789-abcd-ef0123456789"
UID_ = UID.replace("-", "_")
CID = "3f9c0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7"
STATIC_HASH = "6d2c4d5b1d6e5e2c9a0f1e2d3c4b5a69"

# Recorded /proc/<pid>/cgroup contents, one per layout the kubelet produces.
V1_CGROUPFS = f"""\
12:pids:/kubepods/besteffort/pod{UID}/{CID}
11:memory:/kubepods/besteffort/pod{UID}/{CID}
10:devices:/kubepods/besteffort/pod{UID}/{CID}
1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}
"""
V1_SYSTEMD = f"""\
11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope
4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope
1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope
"""
V2_SYSTEMD = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
              f"cri-containerd-{CID}.scope\n")


@pytest.mark.parametrize(("text", "uid"), [
    pytest.param(V1_CGROUPFS, UID, id="v1-cgroupfs-besteffort"),
    pytest.param(f"4:memory:/kubepods/burstable/pod{UID}/{CID}\n", UID, id="v1-cgroupfs-burstable"),
    pytest.param(f"4:memory:/kubepods/pod{UID}/{CID}\n", UID, id="v1-cgroupfs-guaranteed"),
    pytest.param(V1_SYSTEMD, UID, id="v1-systemd-docker"),
    pytest.param(V2_SYSTEMD, UID, id="v2-systemd-containerd"),
    pytest.param(f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope",
                 UID, id="v2-systemd-guaranteed"),
    pytest.param(f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}"
                 f".slice/crio-{CID}.scope", UID, id="v2-systemd-crio"),
    pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}", UID, id="v2-cgroupfs"),
    pytest.param(f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
                 UID, id="v2-seen-through-a-cgroup-namespace"),
    pytest.param(f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
                 f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
                 UID, id="kind"),
    pytest.param(f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}"
                 ".slice", UID, id="v2-pod-level-no-container"),
    pytest.param(f"0::/kubepods/burstable/pod{UID.upper()}/{CID}", UID, id="upper-case-hex"),
    pytest.param(f"4:memory:/kubepods/burstable/pod{STATIC_HASH}/{CID}", STATIC_HASH,
                 id="static-pod-config-hash"),
    pytest.param("0::/system.slice/containerd.service\n", None, id="host-service"),
    pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", None, id="login-session"),
    pytest.param("0::/init.scope\n", None, id="init"),
    pytest.param(f"0::/docker/{CID}\n", None, id="plain-docker"),
    pytest.param("0::/\n", None, id="root"),
    pytest.param("", None, id="empty"),
    pytest.param("garbage without colons\n", None, id="malformed"),
    pytest.param(f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}", None, id="short-uid"),
    pytest.param(f"0::/kubepods/burstable/notapod{UID}x/{CID}", None, id="not-a-pod-segment"),
])
def test_pod_uid_from_cgroup(text: str, uid: str | None) -> None:
    assert pod_uid_from_cgroup(text) == uid


def test_hybrid_v1_v2_file_finds_the_pod_in_any_line() -> None:
    text = f"0::/\n{V1_CGROUPFS}"
    assert pod_uid_from_cgroup(text) == UID


def _proc(root: Path, pid: int, text: str) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "cgroup").write_text(text)


def test_pod_uid_for_pid_reads_the_proc_root(tmp_path: Path) -> None:
    _proc(tmp_path, 4242, V2_SYSTEMD)
    _proc(tmp_path, 1, "0::/init.scope\n")
    assert pod_uid_for_pid(4242, tmp_path) == UID
    assert pod_uid_for_pid(1, tmp_path) is None
    assert pod_uid_for_pid(999, tmp_path) is None  # exited since NVML listed it


REF = PodRef("serving", "llama-7b-0", UID)
OTHER = PodRef("batch", "embed-0", "0b8f0c8e-3333-4a4a-9b9b-000000000003")


def test_directory_lists_once_and_serves_from_cache() -> None:
    lister = FakeLister([PodRecord(REF), PodRecord(OTHER)])
    directory = PodDirectory(lister, clock=FakeClock(0.0))
    assert directory.lookup(UID) == REF
    assert directory.lookup(OTHER.uid) == OTHER
    assert lister.calls == 1


def test_the_directory_lists_every_gpu_pod_with_its_share_no_older_than_max_age() -> None:
    clock = FakeClock(0.0)
    request = PodRequest(namespace="serving", name="llama-7b-0", num_gpu=1, gpu_milli=1000)
    lister = FakeLister([PodRecord(REF, share=PodShare(request, (0,), "0")), PodRecord(OTHER)])
    directory = PodDirectory(lister, clock=clock, max_age_s=300.0)
    assert directory.shares() == [(REF, PodShare(request, (0,), "0"))]  # CPU pods: none
    lister.records = []
    clock.advance(300.0)
    assert len(directory.shares()) == 1 and lister.calls == 1  # served from the cache
    clock.advance(1.0)
    assert directory.shares() == [] and lister.calls == 2  # the pod left


def test_a_miss_refreshes_but_no_more_often_than_min_refresh() -> None:
    clock = FakeClock(0.0)
    lister = FakeLister([PodRecord(OTHER)])
    directory = PodDirectory(lister, clock=clock, min_refresh_s=10.0)
    assert directory.lookup(UID) is None
    assert lister.calls == 1
    lister.records.append(PodRecord(REF))  # the pod starts
    clock.advance(5.0)
    assert directory.lookup(UID) is None  # too soon to ask again
    assert lister.calls == 1
    clock.advance(5.0)
    assert directory.lookup(UID) == REF
    assert lister.calls == 2


def test_an_old_cache_is_rebuilt_so_departed_pods_are_dropped() -> None:
    clock = FakeClock(0.0)
    lister = FakeLister([PodRecord(REF)])
    directory = PodDirectory(lister, clock=clock, max_age_s=300.0)
    assert directory.lookup(UID) == REF
    lister.records = []
    clock.advance(301.0)
    assert directory.lookup(UID) is None
    assert lister.calls == 2


def test_static_pods_resolve_by_config_hash() -> None:
    mirror = PodRef("kube-system", "gpu-probe-node1", "d2a4e7f0-aaaa-bbbb-cccc-000000000000")
    directory = PodDirectory(FakeLister([PodRecord(mirror, config_hash=STATIC_HASH)]),
                             clock=FakeClock(0.0))
    assert directory.lookup(STATIC_HASH) == mirror
    assert directory.lookup(mirror.uid) == mirror


def test_list_failures_keep_the_cache_and_log_once_per_streak() -> None:
    clock = FakeClock(0.0)
    log = RecordingLog()
    lister = FakeLister([PodRecord(REF)])
    directory = PodDirectory(lister, clock=clock, min_refresh_s=10.0, max_age_s=30.0,
                             log=log.as_logger())
    assert directory.lookup(UID) == REF
    lister.error = PodListError("HTTP 503")
    for _ in range(3):
        clock.advance(31.0)
        assert directory.lookup(UID) == REF  # stale but better than nothing
    assert log.events() == ["pod_list_failed"]
    lister.error = None
    clock.advance(31.0)
    directory.lookup(UID)
    assert log.events() == ["pod_list_failed", "pod_list_recovered"]


def test_resolver_joins_cgroup_and_directory(tmp_path: Path) -> None:
    _proc(tmp_path, 4242, V2_SYSTEMD)
    _proc(tmp_path, 7070, "0::/system.slice/xorg.service\n")
    resolver = PodResolver(PodDirectory(FakeLister([PodRecord(REF)]), clock=FakeClock(0.0)),
                           tmp_path)
    assert resolver.pod_for_pid(4242) == REF
    assert resolver.pod_for_pid(7070) is None
    assert resolver.pod_for_pid(31337) is None
    assert (resolver.stray_reason(7070), resolver.stray_reason(31337)) == ("no_pod", "no_pod")


def test_a_process_whose_pod_is_no_longer_listed_is_a_stray_of_a_gone_pod(
        tmp_path: Path) -> None:
    _proc(tmp_path, 4242, V2_SYSTEMD)
    resolver = PodResolver(PodDirectory(FakeLister([]), clock=FakeClock(0.0)), tmp_path)
    assert resolver.pod_for_pid(4242) is None
    assert resolver.stray_reason(4242) == "pod_gone"


def test_the_mps_server_is_in_no_pod_by_design_and_no_stray(tmp_path: Path) -> None:
    _proc(tmp_path, 5151, "0::/system.slice/nvidia-mps.service\n")
    (tmp_path / "5151" / "comm").write_text("nvidia-cuda-mps-server\n")
    _proc(tmp_path, 7070, "0::/system.slice/xorg.service\n")
    (tmp_path / "7070" / "comm").write_text("Xorg\n")
    resolver = PodResolver(PodDirectory(FakeLister([]), clock=FakeClock(0.0)), tmp_path)
    assert (resolver.stray_reason(5151), resolver.stray_reason(7070)) == ("", "no_pod")


# KubePodLister against the real API server: tests/e2e/test_agent.py.
