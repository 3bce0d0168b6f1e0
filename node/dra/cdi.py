"""CDI spec files: how a prepared claim reaches the container (pure building, atomic writes).

The kubelet hands the container runtime the CDI device IDs NodePrepareResources answers; the
runtime (containerd, CRI-O) reads the spec files under ``/var/run/cdi`` and applies the named
devices' ``containerEdits``. Each prepared claim gets one file, ``<vendor>-<class>_<claim
UID>.json``, holding one CDI device per request of the claim, named ``<claim UID>-<request>``:
its edits are the request's :class:`~node.gpus.ContainerGrant` (environment, device nodes,
bind mounts). One device per request rather than per GPU, because ``NVIDIA_VISIBLE_DEVICES``
must list every GPU of the request at once: two devices each setting it would overwrite each
other.

The spec declares CDI 0.5.0, the oldest version that allows a device name to start with a
digit, as a claim UID may (the CDI library refuses a 0.3.0 or 0.4.0 spec with such a name: seen
with containerd 2, whose pod then never started); every field used here (``env``,
``deviceNodes`` with ``path`` and ``permissions``, ``mounts`` with ``hostPath``,
``containerPath`` and ``options``) is older. Runtimes that read CDI at all (containerd 1.7+,
CRI-O) accept it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

from node.gpus import ContainerGrant

CDI_VERSION = "0.5.0"


def device_name(claim_uid: str, request: str) -> str:
    """A request of a ``firstAvailable`` list is ``<request>/<subrequest>``; CDI names take
    no slash."""
    return f"{claim_uid}-{request.replace('/', '_')}"


def device_id(kind: str, claim_uid: str, request: str) -> str:
    """The fully qualified CDI device ID (``vendor/class=name``) the kubelet passes on."""
    return f"{kind}={device_name(claim_uid, request)}"


def spec_file_name(kind: str, claim_uid: str) -> str:
    return f"{kind.replace('/', '-')}_{claim_uid}.json"


def container_edits(grant: ContainerGrant) -> dict[str, Any]:
    edits: dict[str, Any] = {
        "env": [f"{name}={value}" for name, value in sorted(grant.envs.items())]}
    if grant.device_paths:
        edits["deviceNodes"] = [{"path": path, "permissions": "rw"}
                                for path in grant.device_paths]
    if grant.mount_paths:
        edits["mounts"] = [{"hostPath": path, "containerPath": path, "options": ["rw", "bind"]}
                           for path in grant.mount_paths]
    return edits


def claim_spec(kind: str, claim_uid: str, grants: Mapping[str, ContainerGrant]) -> dict[str, Any]:
    """The CDI spec of one claim: a device per request (``grants`` by request name)."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": kind,
        "devices": [{"name": device_name(claim_uid, request),
                     "containerEdits": container_edits(grant)}
                    for request, grant in sorted(grants.items())],
    }


class SpecDir:
    """The directory the runtime reads CDI specs from; one file per prepared claim."""

    def __init__(self, path: str, kind: str) -> None:
        self.path = path
        self.kind = kind

    def file_path(self, claim_uid: str) -> str:
        return os.path.join(self.path, spec_file_name(self.kind, claim_uid))

    def write(self, claim_uid: str, spec: Mapping[str, Any]) -> None:
        """Write the claim's spec atomically (a temporary file renamed over it): a runtime
        reading the directory meanwhile sees the old file or the new one, never half of one.
        Writing the same claim again replaces it, which makes a repeated prepare harmless."""
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-", suffix=".partial")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(spec, out, indent=1, sort_keys=True)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.file_path(claim_uid))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def remove(self, claim_uid: str) -> bool:
        """Remove the claim's spec; False when there was none (already unprepared)."""
        try:
            os.unlink(self.file_path(claim_uid))
        except FileNotFoundError:
            return False
        return True
