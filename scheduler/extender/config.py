"""The extender's configuration: frozen dataclasses with defaults, validated once at load.

Sources, later ones winning: the defaults below, a YAML file (``--config``), environment
variables ``GPUFRAG_EXTENDER__<SECTION>__<FIELD>`` (``__`` separates path parts, e.g.
``GPUFRAG_EXTENDER__AFFINITY__WARM_WINDOW_S=600``), then command-line flags (``--set
affinity.warm_window_s=600`` and the named flags of ``gpufrag extender``). Every error names the
exact field (``weights.affinity``), the bad value and what would be accepted, and nothing on the
request path re-checks a setting. Units are in the field names (``_s`` seconds, ``_bytes``).
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from gpufrag.conventions import KubeNames, dns_subdomain_problem, names_from_environ
from gpufrag.errors import BadInput
from scheduler.core.types import MAX_GPUS_PER_NODE, MILLI_PER_GPU
from scheduler.kube.claims import DEVICE_CLASSES, DRIVER_NAME
from scheduler.kube.watch import WatchConfig
from scheduler.policies import POLICY_NAMES
from scheduler.policies.affinity import AffinityParams

ENV_PREFIX = "GPUFRAG_EXTENDER__"


class ConfigError(BadInput):
    """A setting that cannot be used; the message names the field and the accepted values."""

    def __init__(self, message: str, *, source: str | None = None,
                 field: str | None = None) -> None:
        super().__init__(message, source=source, field=field)


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """How the prioritize score blends the policy's (normalised) score and the affinity bonus."""

    policy: float = 1.0
    affinity: float = 0.5


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task spec of FGD's target workload (see ``scheduler.core.fragmentation``)."""

    cpu_milli: int = 0
    num_gpu: int = 1
    gpu_milli: int = MILLI_PER_GPU
    gpu_spec: tuple[str, ...] = ()
    popularity: float = 1.0


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """FGD's target workload: fixed ``specs``, or (when empty) derived from the pods the
    extender sees, recomputed every ``refresh_s`` or once pod changes reach ``change_fraction``
    of the pods (0 = only every ``refresh_s``), in the background — never per request."""

    specs: tuple[TaskSpec, ...] = ()
    refresh_s: float = 300.0
    change_fraction: float = 0.1
    coverage: float = 0.95


@dataclass(frozen=True, slots=True)
class BindConfig:
    """The optional bind verb: choose GPUs, create the Binding that also annotates the pod
    with them, and count the placement at once ("assumed") until the watch shows it or
    ``assume_ttl_s`` passes."""

    enabled: bool = True
    assume_ttl_s: float = 30.0


FILTER_ANSWERS = ("decide", "feasible")
MAX_AWAIT_WATCH_S = 1.0  # the event loop answers filters: a wait must stay short


@dataclass(frozen=True, slots=True)
class FilterConfig:
    """What the filter verb answers.

    ``decide`` (the default): the extender's own choice — the node FGD and affinity rank first,
    or the best ``nodes`` of them, best first — in ``NodeNames``, its GPUs assumed in the cache
    at once (so the next pod's filter sees them; the bind confirms the assumption, a bind
    elsewhere or ``bind.assume_ttl_s`` releases it). With one node, kube-scheduler skips its own
    scoring and the prioritize verb is not needed (drop ``prioritizeVerb``). Nodes left out
    carry no reason; only when the pod fits no node does every node get its reason (so that
    preemption sees which nodes a victim could free). ``feasible``: every node the pod fits,
    for kube-scheduler to rank with prioritize. See "The filter decides" in docs/extender.md.

    ``await_watch_s``: with ``decide``, how long a filter for a GPU pod the watch has not shown
    yet waits for it (kube-scheduler's informer can be ahead of the extender's watch in a
    burst): only a pod the watch has seen holds its decision's GPUs. 0: never wait.
    """

    answer: str = "decide"
    nodes: int = 1
    await_watch_s: float = 0.05


@dataclass(frozen=True, slots=True)
class HintsConfig:
    """Whether to read the defrag controller's placement hints; their ConfigMap is named in the
    shared ``names`` section (``names.hints_namespace``, ``names.hints_configmap``)."""

    enabled: bool = True


@dataclass(frozen=True, slots=True)
class DraConfig:
    """Whether pods hold GPUs through DRA ResourceClaims (docs/dra.md, "What reads claims"):
    when on, the extender also lists and watches ResourceClaims and counts a pod on the GPUs
    its claims' allocations name for ``driver`` (a DRA pod has no annotation record). Off by
    default: it needs the resource.k8s.io/v1 API and list/watch on resourceclaims.

    ``device_classes``: the DeviceClasses whose requests ask the driver's GPUs. A pod whose
    claims ask them is judged for those GPUs, its nodes scored for the GPU DRA's first fit
    gives there, and that GPU assumed until its claim's allocation shows."""

    enabled: bool = False
    driver: str = DRIVER_NAME
    device_classes: tuple[str, ...] = DEVICE_CLASSES


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """HTTP serving: routes are ``{url_prefix}/filter`` etc., in one process (the state lives
    in it), on the project's one server (:mod:`scheduler.extender.server`): filter and
    prioritize answered on its event loop, bind and preempt on ``threads`` threads.

    ``host`` is the loopback address by default: the extender runs as a sidecar of its
    kube-scheduler, and ``/bind`` writes Bindings with the pod's service account, so it should
    answer nobody else unless asked to (see "Threat model" in docs/operations.md).

    ``read_timeout_s`` bounds how long a request's body may take to arrive after its headers
    (408 past it), and a TLS handshake: slow clients hold no thread (they wait on the event
    loop). ``health_port`` (0 = off) serves ``/healthz``, ``/readyz`` and ``/metrics`` on a
    listener of their own, so that probes never queue behind verbs; its ``/healthz`` fails
    once the verbs' loop has not ticked for ``timeout_s``.

    ``switch_interval_s`` is the worker's ``sys.setswitchinterval``: how long a thread that
    wants the GIL waits for a busy one to hand it over (a filter can wait behind the watch and
    bind threads). Python's own 5 ms is the default: 0.5 ms was ahead in 7 of 10 paired rounds
    of ``benchmarks.scheduling_throughput`` over three runs, but behind in the median round of
    the quietest run, where the target is hardest, so no effect beyond the spread between rounds
    is established (its ``gpufrag-decide-0.5ms`` row keeps the comparison; docs/extender.md,
    Performance).

    TLS: with ``tls_cert_file`` and ``tls_key_file`` the verbs are served over HTTPS (for
    kube-scheduler's ``enableHTTPS``); with ``tls_client_ca_file`` too, every client must
    present a certificate signed by that CA (the ``certFile``/``keyFile`` of the extender's
    ``tlsConfig``). The files are read and checked at load.
    """

    host: str = "127.0.0.1"
    port: int = 8888
    url_prefix: str = ""
    max_body_bytes: int = 64 * 1024 * 1024
    # What the verbs may build from their bodies at once (parsed JSON, answers): see
    # scheduler.extender.app. With the bodies held (2 x max_body_bytes) and the state of a
    # 5,000-node cluster (~300 MB), it keeps the extender under 80% of its 1 GiB limit
    # (benchmarks/memory_peak.py).
    memory_budget_bytes: int = 320 * 1024 * 1024
    threads: int = 8
    timeout_s: float = 30.0
    read_timeout_s: float = 5.0
    switch_interval_s: float = 0.005
    health_host: str = "127.0.0.1"
    health_port: int = 0
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    policy: str = "fgd"
    seed: int = 0
    names: KubeNames = field(default_factory=KubeNames)
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    affinity: AffinityParams = field(default_factory=AffinityParams)
    filter: FilterConfig = field(default_factory=FilterConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    bind: BindConfig = field(default_factory=BindConfig)
    hints: HintsConfig = field(default_factory=HintsConfig)
    dra: DraConfig = field(default_factory=DraConfig)
    watch: WatchConfig = field(default_factory=WatchConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    maintenance_interval_s: float = 5.0


# ------------------------------------------------------------------------------------ loading


@dataclass(frozen=True, slots=True)
class _Text:
    """A value given as text (environment, ``--set``): parsed as YAML unless a string is
    expected, so ``names.label_model_version=1.10`` stays the string "1.10"."""

    text: str
    origin: str


T = TypeVar("T")


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(tp, "a list")


def _convert(tp: Any, value: Any, path: str) -> Any:
    if isinstance(value, _Text):
        if tp is str:
            return value.text
        try:
            value = yaml.safe_load(value.text)
        except yaml.YAMLError:
            raise ConfigError(f"{value.text!r} (from {value.origin}) is not {_type_name(tp)}",
                              field=path) from None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a mapping, got {value!r}", field=path)
        return _build(tp, value, path)
    if typing.get_origin(tp) is tuple:
        item_type = typing.get_args(tp)[0]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"expected a list, got {value!r}", field=path)
        return tuple(_convert(item_type, v, f"{path}[{i}]") for i, v in enumerate(value))
    ok = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, int | float) and not isinstance(value, bool),
        str: isinstance(value, str),
    }.get(tp)
    if ok is None:  # pragma: no cover - a field type this loader does not know is a bug here
        raise TypeError(f"config field {path} has unsupported type {tp!r}")
    if not ok:
        raise ConfigError(f"expected {_type_name(tp)}, got {value!r}", field=path)
    return float(value) if tp is float else value


# Settings earlier releases had, and what to do instead (an upgrade's config says why it fails).
REMOVED = {"server.engine": "the extender has one server (uvicorn, docs/extender.md); "
                            "remove it"}


def _build(cls: type[T], data: Mapping[str, Any], path: str) -> T:
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        where = f"{path}.{key}" if path else str(key)
        if where in REMOVED:
            raise ConfigError(f"no longer a setting: {REMOVED[where]}", field=where)
        if key not in known:
            raise ConfigError(f"unknown setting; known here: {', '.join(known)}", field=where)
        kwargs[key] = _convert(hints[key], value, where)
    return cls(**kwargs)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError("empty setting name", field=dotted)
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def _env_overrides(environ: Mapping[str, str]) -> list[tuple[str, _Text]]:
    found = []
    for name, text in sorted(environ.items()):
        if name.startswith(ENV_PREFIX):
            dotted = ".".join(p.lower() for p in name[len(ENV_PREFIX):].split("__"))
            found.append((dotted, _Text(text, f"environment {name}")))
    return found


def parse_assignment(text: str) -> tuple[str, str]:
    """``path.to.field=value`` (a ``--set`` flag) -> (path, value)."""
    dotted, sep, value = text.partition("=")
    if not sep or not dotted.strip():
        raise ConfigError(f"{text!r} is not PATH=VALUE (e.g. affinity.warm_window_s=600)",
                          field="--set")
    return dotted.strip(), value


def read_config_file(path: str | Path) -> dict[str, Any]:
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", source=source) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"not valid YAML: {e}", source=source) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping at the top, got {type(data).__name__}",
                          source=source)
    return data


def load_config(path: str | Path | None = None, *, environ: Mapping[str, str] | None = None,
                overrides: Sequence[tuple[str, str]] = ()) -> ExtenderConfig:
    """Defaults < the shared names (``GPUFRAG_NAMES__*``) < YAML file < environment <
    ``overrides`` ((dotted path, text) pairs)."""
    env = os.environ if environ is None else environ
    tree: dict[str, Any] = read_config_file(path) if path is not None else {}
    shared = names_from_environ(env)
    names = tree.setdefault("names", {})
    if isinstance(names, dict):
        for key, value in dataclasses.asdict(shared).items():
            names.setdefault(key, value)
    for dotted, value in _env_overrides(env):
        _set_path(tree, dotted, value)
    for dotted, text in overrides:
        _set_path(tree, dotted, _Text(text, f"--set {dotted}"))
    try:
        return config_from_mapping(tree)
    except ConfigError as e:
        if path is not None and e.source is None:
            raise ConfigError(e.detail, source=str(path), field=e.field) from None
        raise


def config_from_mapping(data: Mapping[str, Any]) -> ExtenderConfig:
    """Build and validate a configuration from nested mappings (a parsed YAML file)."""
    return validate(_build(ExtenderConfig, data, ""))


def config_to_mapping(config: ExtenderConfig) -> dict[str, Any]:
    """Plain nested dicts and lists (for ``--print-config``); loads back to the same config."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    result: dict[str, Any] = plain(config)
    return result


# --------------------------------------------------------------------------------- validation


def _problems(config: ExtenderConfig) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def need(ok: bool, where: str, message: str) -> None:
        if not ok:
            found.append((where, message))

    driver_problem = dns_subdomain_problem(config.dra.driver)
    need(driver_problem is None, "dra.driver", f"{config.dra.driver!r}: {driver_problem}")
    for i, device_class in enumerate(config.dra.device_classes):
        class_problem = dns_subdomain_problem(device_class)
        need(class_problem is None, f"dra.device_classes[{i}]",
             f"{device_class!r}: {class_problem}")
    need(config.policy in POLICY_NAMES, "policy",
         f"unknown policy {config.policy!r}; choose from {', '.join(POLICY_NAMES)}")
    for name in ("policy", "affinity"):
        value = getattr(config.weights, name)
        need(value >= 0, f"weights.{name}", f"must be >= 0, got {value}")
    need(config.weights.policy != 0 or config.weights.affinity != 0, "weights",
         "weights.policy and weights.affinity cannot both be 0")
    found += [(f"affinity.{f}", m) for f, m in config.affinity.problems()]
    found += [(f"names.{f}", m) for f, m in config.names.problems()]
    w = config.workload
    need(w.refresh_s > 0, "workload.refresh_s", f"must be > 0 seconds, got {w.refresh_s}")
    need(0 < w.coverage <= 1, "workload.coverage", f"must be in (0, 1], got {w.coverage}")
    need(0 <= w.change_fraction <= 1, "workload.change_fraction",
         f"must be in 0..1 (0 = refresh only every workload.refresh_s), got "
         f"{w.change_fraction}")
    for i, spec in enumerate(w.specs):
        at = f"workload.specs[{i}]"
        need(spec.cpu_milli >= 0, f"{at}.cpu_milli", f"must be >= 0, got {spec.cpu_milli}")
        need(0 <= spec.num_gpu <= MAX_GPUS_PER_NODE, f"{at}.num_gpu",
             f"must be in 0..{MAX_GPUS_PER_NODE}, got {spec.num_gpu}")
        if spec.num_gpu:
            need(0 < spec.gpu_milli <= MILLI_PER_GPU, f"{at}.gpu_milli",
                 f"must be in 1..{MILLI_PER_GPU} for a GPU spec, got {spec.gpu_milli}")
            need(spec.num_gpu == 1 or spec.gpu_milli == MILLI_PER_GPU, f"{at}.gpu_milli",
                 f"a GPU share ({spec.gpu_milli} < {MILLI_PER_GPU}) needs num_gpu 1, "
                 f"got num_gpu {spec.num_gpu}")
        else:
            need(spec.gpu_milli in (0, MILLI_PER_GPU), f"{at}.gpu_milli",
                 f"must be 0 for a CPU-only spec (num_gpu 0), got {spec.gpu_milli}")
        need(spec.popularity > 0, f"{at}.popularity", f"must be > 0, got {spec.popularity}")
    need(config.filter.answer in FILTER_ANSWERS, "filter.answer",
         f"must be one of {', '.join(FILTER_ANSWERS)}, got {config.filter.answer!r}")
    need(config.filter.nodes >= 1, "filter.nodes",
         f"must be >= 1 (the nodes a deciding filter answers with), got {config.filter.nodes}")
    need(0 <= config.filter.await_watch_s <= MAX_AWAIT_WATCH_S, "filter.await_watch_s",
         f"must be in [0, {MAX_AWAIT_WATCH_S:g}] seconds, got {config.filter.await_watch_s}")
    need(config.bind.assume_ttl_s > 0, "bind.assume_ttl_s",
         f"must be > 0 seconds, got {config.bind.assume_ttl_s}")
    wc = config.watch
    need(wc.timeout_s > 0, "watch.timeout_s", f"must be > 0 seconds, got {wc.timeout_s}")
    need(wc.page_size >= 1, "watch.page_size", f"must be >= 1, got {wc.page_size}")
    need(wc.relist_s == 0 or wc.relist_s >= wc.timeout_s, "watch.relist_s",
         f"must be 0 (never) or >= watch.timeout_s ({wc.timeout_s}), got {wc.relist_s}")
    need(wc.backoff_initial_s > 0, "watch.backoff_initial_s",
         f"must be > 0 seconds, got {wc.backoff_initial_s}")
    need(wc.backoff_max_s >= wc.backoff_initial_s, "watch.backoff_max_s",
         f"must be >= watch.backoff_initial_s ({wc.backoff_initial_s}), got {wc.backoff_max_s}")
    s = config.server
    need(s.url_prefix == "" or (s.url_prefix.startswith("/") and not s.url_prefix.endswith("/")),
         "server.url_prefix",
         f"must be empty or start with '/' and not end with '/' (e.g. /gpufrag), "
         f"got {s.url_prefix!r}")
    need(s.max_body_bytes >= 1024, "server.max_body_bytes",
         f"must be >= 1024 bytes, got {s.max_body_bytes}")
    need(s.threads >= 1, "server.threads", f"must be >= 1, got {s.threads}")
    need(s.memory_budget_bytes >= 1024 * 1024, "server.memory_budget_bytes",
         f"must be >= 1048576 bytes (1 MiB), got {s.memory_budget_bytes}")
    need(0 < s.port < 65536, "server.port", f"must be in 1..65535, got {s.port}")
    need(s.timeout_s > 0, "server.timeout_s", f"must be > 0 seconds, got {s.timeout_s}")
    need(s.read_timeout_s > 0, "server.read_timeout_s",
         f"must be > 0 seconds, got {s.read_timeout_s}")
    need(0 < s.switch_interval_s <= 0.1, "server.switch_interval_s",
         f"must be > 0 and <= 0.1 seconds, got {s.switch_interval_s}")
    need(0 <= s.health_port < 65536, "server.health_port",
         f"must be in 1..65535, or 0 for no separate health listener, got {s.health_port}")
    need(s.health_port != s.port, "server.health_port",
         f"must differ from server.port ({s.port}), or be 0 for no separate health listener")
    found += _tls_problems(s)
    need(config.maintenance_interval_s > 0, "maintenance_interval_s",
         f"must be > 0 seconds, got {config.maintenance_interval_s}")
    return found


def _tls_problems(s: ServerConfig) -> list[tuple[str, str]]:
    """The TLS files: a certificate and its key together or neither, a client CA only with
    them, each readable, and all of them loadable as they would be when serving.

    Checked here, with the rest of the configuration, so that a key that does not match its
    certificate is one line at start-up (exit 2), not every kube-scheduler call failing."""
    found: list[tuple[str, str]] = []
    if bool(s.tls_cert_file) != bool(s.tls_key_file):
        given, missing = (("tls_cert_file", "tls_key_file") if s.tls_cert_file
                          else ("tls_key_file", "tls_cert_file"))
        found.append((f"server.{missing}", f"must be set too when server.{given} is: a "
                                           "certificate and its key come together"))
    if s.tls_client_ca_file and not s.tls_cert_file:
        found.append(("server.tls_client_ca_file",
                      "needs server.tls_cert_file and server.tls_key_file: clients are "
                      "verified only over TLS"))
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file"):
        path = getattr(s, name)
        if not path:
            continue
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as e:
            found.append((f"server.{name}", f"cannot read {path!r}: {e.strerror}"))
    if found or not s.tls_cert_file:
        return found
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(s.tls_cert_file, s.tls_key_file)
    except (ssl.SSLError, ValueError) as e:
        found.append(("server.tls_cert_file",
                      f"{s.tls_cert_file!r} with key {s.tls_key_file!r} is not a usable PEM "
                      f"certificate and matching private key: {e}"))
    if s.tls_client_ca_file:
        try:
            context.load_verify_locations(cafile=s.tls_client_ca_file)
        except (ssl.SSLError, ValueError) as e:
            found.append(("server.tls_client_ca_file",
                          f"{s.tls_client_ca_file!r} holds no usable PEM CA certificate: {e}"))
    return found


def validate(config: ExtenderConfig) -> ExtenderConfig:
    """Return ``config`` unchanged, or raise one :class:`ConfigError` listing every problem."""
    found = _problems(config)
    if not found:
        return config
    if len(found) == 1:
        raise ConfigError(found[0][1], field=found[0][0])
    text = "; ".join(f"field {where!r}: {message}" for where, message in found)
    raise ConfigError(f"{len(found)} problems: {text}")


__all__ = [
    "ENV_PREFIX",
    "FILTER_ANSWERS",
    "AffinityParams",
    "BindConfig",
    "ConfigError",
    "DraConfig",
    "ExtenderConfig",
    "FilterConfig",
    "HintsConfig",
    "ScoreWeights",
    "ServerConfig",
    "TaskSpec",
    "WatchConfig",
    "WorkloadConfig",
    "config_from_mapping",
    "config_to_mapping",
    "load_config",
    "parse_assignment",
    "validate",
]
