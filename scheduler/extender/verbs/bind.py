"""The bind verb: the Binding of a pod to the node kube-scheduler chose, with its GPUs.

The GPUs are those decided at filter (``filter.answer: decide``, assumed then) or, without a
decision, chosen on the node now and counted at once; they are recorded on the pod for the
device plugin (:mod:`scheduler.kube.binder`, the one writer). A pod that gets its GPUs through
DRA claims (``dra.enabled``) is bound with no record: the GPUs assumed are the ones DRA's first
fit takes, and its claims' allocation replaces them once the watch shows it. A bind that
cannot be done is refused with the reason (:class:`BindRefused`), which kube-scheduler reports
on the pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpufrag.errors import BadInput
from gpufrag.records import RecordSigner, gpu_indices_text
from scheduler.core.feasibility import explain
from scheduler.core.types import PodRequest
from scheduler.extender.migscoring import NOT_MIG_NODE, shortfall
from scheduler.extender.placement import Placement
from scheduler.extender.subject import PodSubject
from scheduler.kube.binder import Binder, BindError
from scheduler.kube.convert import UnsupportedRequest, device_plugin_annotations

# The scheduler the API server names in a pod created without spec.schedulerName.
API_DEFAULT_SCHEDULER = "default-scheduler"


class BindRefused(Exception):
    """The bind cannot be done; the message says why (it goes back in ``Error``)."""


@dataclass(frozen=True, slots=True)
class BindOutcome:
    node: str
    gpus: tuple[int, ...]


class BindVerb:
    def __init__(self, placement: Placement, binder: Binder | None) -> None:
        self.placement = placement
        self.binder = binder  # None: binding is disabled (bind.enabled: false)
        # Signs the GPU record of each bind, for gpufrag's device plugin (gpufrag.records);
        # None: no record is signed (a snapshot, another device plugin, or the key is not had
        # yet: scheduler.kube.recordkeys.SignerBootstrap sets it).
        self.signer: RecordSigner | None = None
        # Whether a GPU bind needs a signed record (a cluster runtime with gpufrag's device
        # plugin): then, until the key is had, a GPU pod's bind is refused with the reason (it
        # stays pending and kube-scheduler retries) instead of binding a record the device
        # plugin will refuse, which fails the pod at the node and loops its controller.
        self.signing_required = False

    def __call__(self, namespace: str, name: str, uid: str, node: str) -> BindOutcome:
        """Bind with the GPUs decided at filter (``filter.answer: decide``, the assumption made
        then) or, without one, choose the GPUs on ``node`` now and count the placement at once.

        Refused (:class:`BindRefused`, nothing written) when the pod is bound already, gone,
        unreadable, not of this scheduler (``names.scheduler_name``), or does not fit."""
        if self.binder is None:
            raise BindRefused("binding is disabled in this extender (bind.enabled: false)")
        cache = self.placement.cache
        key = f"{namespace}/{name}"
        pod = self._subject(namespace, name, uid)
        request = pod.request
        # The Binding carries the UID kube-scheduler decided for (a pod re-created under the
        # same name meanwhile is refused by the API server, not bound by a stale decision);
        # the pod's own UID only when kube-scheduler sent none.
        uid = uid or pod.uid
        with cache.lock, cache.reservations.lifted_for_pod(key, pod.owner, pod.uid):
            state = cache.state
            row = state.index.get(node)
            if row is None or not state.active[row]:
                raise BindRefused(f"node {node} is not known to the gpufrag extender")
            current = state.pods.get(key)
            assumed = key in cache.assumed
            if current is not None and key in cache.decided and current.node != node:
                # Decided (at filter) elsewhere, bound here: the decision no longer holds.
                cache.forget(key)
                current = None
            if current is not None and assumed and current.node == node:
                gpus = current.gpus  # the filter's decision, or a retried bind: same answer
                cache.confirm(key)
            elif current is not None:
                raise BindRefused(f"pod {key} is already placed on {current.node}")
            elif pod.mig:
                self._check_mig_fits(key, pod.mig, node)
                cache.mig.set_ask(key, pod.mig)  # held there from now (a pod not yet seen)
                gpus = ()
                cache.assume(request, row, gpus)
            else:
                decision = self.placement.scorer_of(pod).place_on(state, request, row)
                if decision is None:
                    reason = explain(state, request, row).reason or "does not fit"
                    raise BindRefused(f"pod {key} does not fit node {node} now: {reason}")
                gpus = decision.gpus
                cache.assume(request, row, gpus)
        # A DRA pod's GPUs are its claims' allocation (kube-scheduler's, written before the
        # bind): no record for a device plugin, which does not serve it.
        recorded = request.wants_gpu and not pod.dra
        try:
            extra = (self._device_plugin_annotations(request, gpus, node, row, namespace, name,
                                                     uid) if recorded else {})
            self.binder.bind(namespace, name, uid, node, gpus if recorded else None,
                             **({"extra": extra} if extra else {}))
        except (BindError, UnsupportedRequest) as e:
            cache.forget(key)
            raise BindRefused(str(e)) from None
        except BaseException:
            cache.forget(key)  # whatever went wrong, the pod is not bound by us
            raise
        return BindOutcome(node, gpus)

    def _subject(self, namespace: str, name: str, uid: str) -> PodSubject:
        """The pod to bind, once it is known to be this scheduler's (its UID says which GPU
        reservations it may use).

        From the cache when it holds this very pod (same UID, which kube-scheduler always
        sends): the watch keeps its spec.schedulerName and request, and a pod's spec cannot
        change those once created. From the API server otherwise (the watch has not shown the
        pod yet, it was re-created under the same name, or no UID was given)."""
        cache = self.placement.cache
        key = f"{namespace}/{name}"
        with cache.lock:
            known = cache.pods.get(key)
        if known is not None and known.node:
            raise BindRefused(f"pod {key} is already bound to {known.node}")
        if known is not None and uid and known.uid == uid:
            self._check_scheduler(key, known.scheduler_name)
            return PodSubject(key, known.uid, known.owner, known.request,
                              cache.mig.ask_of(key), None, cache.claim_keys(key),
                              cache.mapped_of(key))
        assert self.binder is not None
        try:
            obj = self.binder.read_pod(namespace, name)
        except BindError as e:
            raise BindRefused(str(e)) from None
        if obj is None:
            raise BindRefused(f"pod {key} not found")
        spec = obj.get("spec")
        actual = spec.get("schedulerName") if isinstance(spec, Mapping) else None
        self._check_scheduler(key, actual if isinstance(actual, str) else "")
        try:
            return self.placement.pods.read(obj)
        except BadInput as e:
            raise BindRefused(f"pod {key} cannot be read: {e}") from None

    def _check_scheduler(self, key: str, actual: str) -> None:
        """Refuse a pod that is not ours to schedule (``actual``: its spec.schedulerName).

        ``/bind`` creates Bindings with the extender's service account, which may bind any pod
        in the cluster; checking that the pod asked for this scheduler keeps a caller that can
        reach the port (or a misconfigured second scheduler) from placing other schedulers'
        pods. An empty schedulerName is what the API server defaults to
        ``default-scheduler``."""
        actual = actual or API_DEFAULT_SCHEDULER
        expected = self.placement.config.names.scheduler_name
        if actual != expected:
            raise BindRefused(f"pod {key} has spec.schedulerName {actual!r}, not {expected!r} "
                              "(names.scheduler_name): the gpufrag extender binds only the pods "
                              "of its own scheduler")

    def _check_mig_fits(self, key: str, ask: Mapping[str, int], node: str) -> None:
        """Refuse the bind of a MIG pod to a node without free instances of what it asks (the
        filter's rule; the device plugin would leave the pod without its instance). Call
        with the cache's lock held."""
        cache = self.placement.cache
        layout = cache.mig.layout(cache.state, node, self.placement.clock(), key)
        short = (NOT_MIG_NODE, True) if layout is None else shortfall(layout, ask)
        if short is not None:
            raise BindRefused(f"pod {key} does not fit node {node} now: {short[0]}")

    def _device_plugin_annotations(self, request: PodRequest, gpus: tuple[int, ...],
                                   node: str, row: int, namespace: str, name: str, uid: str
                                   ) -> dict[str, str]:
        """What ``names.device_plugin``'s device plugin reads, besides the GPU indices: for
        gpufrag's own, the signed record of them (bound to the pod's UID and node).

        HAMi's are written per container, so that mode reads the pod (and the node, for its
        GPUs' UUIDs) from the API server; the bind is otherwise served from the cache."""
        names = self.placement.config.names
        if not request.wants_gpu:
            return {}
        if names.device_plugin == "gpufrag":
            if self.signer is None:
                if self.signing_required:
                    raise BindRefused(
                        f"pod {namespace}/{name} is not bound yet: the extender has no GPU-record "
                        f"signing key yet (Secret {names.hints_namespace}/"
                        f"{names.record_key_secret}; see the extender's 'record key "
                        f"unavailable' log line), and gpufrag's device plugin honours only "
                        f"signed records; the pod stays pending and is retried")
                return {}
            return {names.annotation_gpu_record: self.signer.sign(
                uid=uid, node=node, gpus_text=gpu_indices_text(gpus))}
        assert self.binder is not None
        node_obj = pod_obj = None
        if names.device_plugin == "hami":
            node_obj = self.binder.read_node(node)
            pod_obj = self.binder.read_pod(namespace, name)
            if pod_obj is None:
                raise BindRefused(f"pod {namespace}/{name} not found")
        with self.placement.cache.lock:
            gpu_memory_mib = int(self.placement.cache.state.gpu_memory_mib[row])
        return device_plugin_annotations(names, request, gpus, node=node,
                                         gpu_memory_mib=gpu_memory_mib, node_obj=node_obj,
                                         now_ns=int(self.placement.clock() * 1e9),
                                         pod_obj=pod_obj)


__all__ = ["API_DEFAULT_SCHEDULER", "BindOutcome", "BindRefused", "BindVerb"]
