"""The kubelet's calls: registration (GetInfo, NotifyRegistrationStatus) and the DRA plugin
service (NodePrepareResources, NodeUnprepareResources).

Prepare reads each claim from the API server (the kubelet sends only its namespace, name and
UID), takes this driver's devices from the allocation kube-scheduler wrote
(:mod:`node.dra.claims`), makes the MIG instances of its partitions (:mod:`node.dra.partitions`),
writes the claim's CDI spec (:mod:`node.dra.cdi`) and answers the CDI device IDs. Unprepare
destroys the MIG instances and removes the spec. Both calls are idempotent: the kubelet
repeats them after a restart or a timeout, so a second prepare finds the instances it made
and rewrites the same file, and a second unprepare finds nothing to remove.

A claim that cannot be prepared is answered in its own ``error`` field, with a message that
says which field and why, and the other claims of the call go on; the RPC itself fails
(``INVALID_ARGUMENT``) only when the request is malformed as a whole (a claim with no UID). A
bug in one claim's handling is caught, logged with its stack and answered as that claim's
error: the driver never dies on input.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import grpc
from structlog.typing import FilteringBoundLogger

from gpufrag.mig_instances import MigWriteError
from node.dra import cdi
from node.dra.api import DRA_PLUGIN_TYPE, DRA_V1_SERVICE, drapb, regpb
from node.dra.claims import ClaimProblem, allocated, prepare
from node.dra.config import CDI_KIND, DraConfig
from node.dra.metrics import DriverMetrics
from node.dra.partitions import Partitions
from node.gpus import DeviceNodes, Gpu
from scheduler.kube.errors import ApiError


class ClaimSource(Protocol):
    """Reads a ResourceClaim as a plain dict (:class:`node.dra.kube.KubeClaims`)."""

    def get(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The claim; raises :class:`ApiError` (404 when it is gone)."""
        ...


class RegistrationServicer:
    """The registration socket's answers, and what the kubelet said back."""

    def __init__(self, config: DraConfig, *, log: FilteringBoundLogger) -> None:
        self._config = config
        self._log = log
        self._registered = threading.Event()
        self.last_error = ""

    @property
    def registered(self) -> bool:
        return self._registered.is_set()

    def wait_registered(self, timeout_s: float) -> bool:
        return self._registered.wait(timeout_s)

    def GetInfo(self, request: regpb.InfoRequest,
                context: grpc.ServicerContext) -> regpb.PluginInfo:
        return regpb.PluginInfo(type=DRA_PLUGIN_TYPE, name=self._config.driver_name,
                                endpoint=self._config.plugin_socket_path,
                                supported_versions=[DRA_V1_SERVICE])

    def NotifyRegistrationStatus(self, request: regpb.RegistrationStatus,
                                 context: grpc.ServicerContext
                                 ) -> regpb.RegistrationStatusResponse:
        if request.plugin_registered:
            self.last_error = ""
            self._registered.set()
            self._log.info("registered", driver=self._config.driver_name)
        else:
            self.last_error = request.error
            self._registered.clear()
            self._log.error("registration_refused", driver=self._config.driver_name,
                            error=request.error)
        return regpb.RegistrationStatusResponse()


class DraPluginServicer:
    """NodePrepareResources / NodeUnprepareResources (module docstring)."""

    def __init__(self, config: DraConfig, gpus: tuple[Gpu, ...], claims: ClaimSource,
                 specs: cdi.SpecDir, nodes: DeviceNodes, metrics: DriverMetrics, *,
                 partitions: Partitions, log: FilteringBoundLogger) -> None:
        self._config = config
        self._partitions = partitions
        self._metrics = metrics
        self._gpus = {gpu.index: gpu for gpu in gpus}
        self._claims = claims
        self._specs = specs
        self._nodes = nodes
        self._log = log

    def NodePrepareResources(self, request: drapb.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext
                             ) -> drapb.NodePrepareResourcesResponse:
        _check_uids(request.claims, context)
        answers = {}
        for claim in request.claims:
            answer = answers[claim.uid] = self._prepare_one(claim)
            self._metrics.claims.labels("prepare", "error" if answer.error else "ok").inc()
        return drapb.NodePrepareResourcesResponse(claims=answers)

    def NodeUnprepareResources(self, request: drapb.NodeUnprepareResourcesRequest,
                               context: grpc.ServicerContext
                               ) -> drapb.NodeUnprepareResourcesResponse:
        _check_uids(request.claims, context)
        answers = {}
        for claim in request.claims:
            try:
                destroyed = self._partitions.unprepare(claim.uid)
                removed = self._specs.remove(claim.uid)
            except (OSError, MigWriteError, ClaimProblem) as exc:
                answers[claim.uid] = drapb.NodeUnprepareResourceResponse(
                    error=f"claim {_key(claim)} (uid {claim.uid}): {exc}")
                self._metrics.claims.labels("unprepare", "error").inc()
                self._log.warning("claim_not_unprepared", claim=_key(claim), uid=claim.uid,
                                  error=str(exc))
                continue
            self._metrics.claims.labels("unprepare", "ok").inc()
            self._log.info("claim_unprepared", claim=_key(claim), uid=claim.uid,
                           removed=removed, mig_instances_destroyed=destroyed)
            answers[claim.uid] = drapb.NodeUnprepareResourceResponse()
        return drapb.NodeUnprepareResourcesResponse(claims=answers)

    def _prepare_one(self, claim: drapb.Claim) -> drapb.NodePrepareResourceResponse:
        try:
            return self._prepare(claim)
        except (ClaimProblem, ApiError, OSError) as exc:
            error = f"claim {_key(claim)} (uid {claim.uid}): {exc}"
            self._log.warning("claim_not_prepared", claim=_key(claim), uid=claim.uid,
                              error=str(exc))
        except Exception as exc:  # a bug must cost one claim, not the driver
            error = f"claim {_key(claim)} (uid {claim.uid}): internal error: {exc!r}"
            self._log.exception("claim_prepare_failed", claim=_key(claim), uid=claim.uid)
        return drapb.NodePrepareResourceResponse(error=error)

    def _prepare(self, claim: drapb.Claim) -> drapb.NodePrepareResourceResponse:
        obj = self._claims.get(claim.namespace, claim.name)
        found = allocated(obj, uid=claim.uid, driver=self._config.driver_name,
                          pool=self._config.node_name, gpus=self._gpus)
        partitions = self._partitions.prepare(claim.uid, found.partitions)
        prepared = prepare((*found.devices, *partitions), nodes=self._nodes,
                           config=self._config)
        self._specs.write(claim.uid, cdi.claim_spec(CDI_KIND, claim.uid, prepared.grants))
        answered: set[str] = set()
        out = []
        for device in prepared.devices:
            # The request's CDI device goes with its first device only: the kubelet hands a
            # container every ID of the devices it uses, and one ID named twice is an error
            # in some runtimes.
            ids = [] if device.request in answered else [
                cdi.device_id(CDI_KIND, claim.uid, device.request)]
            answered.add(device.request)
            out.append(drapb.Device(request_names=[device.request], pool_name=device.pool,
                                    device_name=device.device, cdi_device_ids=ids,
                                    share_id=device.share_id))
        self._log.info("claim_prepared", claim=_key(claim), uid=claim.uid,
                       devices=[d.device for d in prepared.devices],
                       gpus=[d.gpu.uuid for d in prepared.devices])
        return drapb.NodePrepareResourceResponse(devices=out)


def _key(claim: drapb.Claim) -> str:
    return f"{claim.namespace}/{claim.name}"


def _check_uids(claims: Any, context: grpc.ServicerContext) -> None:
    """The answer is a map by claim UID: a claim without one cannot be answered at all."""
    for i, claim in enumerate(claims):
        if not claim.uid or not claim.name or not claim.namespace:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"claims[{i}]: namespace, name and uid are required (got "
                          f"namespace={claim.namespace!r}, name={claim.name!r}, "
                          f"uid={claim.uid!r})")
