"""``gpufrag extender``: run the kube-scheduler extender webhook.

State comes from a live cluster (``--kubeconfig FILE``, or in-cluster with the pod's service
account when neither it nor a snapshot is given) or from a static snapshot
(``--cluster-snapshot FILE``, written by ``gpufrag export-snapshot``; binds are then dry runs).
Settings: defaults < ``--config FILE`` (YAML) < ``GPUFRAG_EXTENDER__<SECTION>__<FIELD>``
environment variables < ``--set PATH=VALUE`` < the named flags. See docs/extender.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import structlog
import yaml

from gpufrag import diagnose
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput
from gpufrag.httpserve import ListenError
from gpufrag.logs import configure
from scheduler.extender.config import (
    ExtenderConfig,
    config_to_mapping,
    load_config,
    parse_assignment,
)
from scheduler.extender.runtime import Runtime, cluster_runtime, freeze_heap, snapshot_runtime
from scheduler.extender.server import serve
from scheduler.kube.client import api_client
from scheduler.kube.snapshot import read_snapshot
from scheduler.policies import POLICY_NAMES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufrag extender", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--cluster-snapshot", metavar="FILE",
                        help="serve a static snapshot (JSON or YAML List of Nodes and Pods)")
    source.add_argument("--kubeconfig", metavar="FILE",
                        help="watch the cluster of this kubeconfig (default: in-cluster)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--config", metavar="FILE", help="YAML configuration file")
    p.add_argument("--host", help="address to listen on (server.host, default 127.0.0.1: "
                                  "the kube-scheduler sidecar; see docs/operations.md)")
    p.add_argument("--port", help="port to listen on (server.port, default 8888)")
    p.add_argument("--url-prefix", metavar="PATH",
                   help="path before /filter, /prioritize, /bind (server.url_prefix)")
    p.add_argument("--policy", choices=POLICY_NAMES, help="placement policy (default fgd)")
    bind = p.add_mutually_exclusive_group()
    bind.add_argument("--bind", dest="bind", action="store_const", const="true",
                      help="serve the bind verb (bind.enabled; the default)")
    bind.add_argument("--no-bind", dest="bind", action="store_const", const="false",
                      help="do not serve the bind verb")
    p.add_argument("--threads", help="request threads (server.threads, default 8)")
    p.add_argument("--set", dest="assignments", action="append", default=[],
                   metavar="PATH=VALUE", help="any setting, e.g. affinity.warm_window_s=600")
    p.add_argument("--log-level", help="debug, info, warning, error (default info)")
    p.add_argument("--print-config", action="store_true",
                   help="print the effective configuration as YAML and exit")
    return p


def _one_line(text: str) -> str:
    """A message on one line: YAML and JSON parsers report over several."""
    return " ".join(text.split())


def _snapshot_runtime(path: str, config: ExtenderConfig) -> Runtime:
    """The runtime serving the snapshot at ``path``; any failure to read it is bad input.

    The snapshot is a file the user gave, so whatever it holds (NaN, Infinity, numbers too
    large, objects of the wrong shape at any depth) is reported as that file being wrong: one
    line, exit 2, never a traceback, even where a reader further down has no check for that
    shape yet."""
    try:
        return snapshot_runtime(read_snapshot(path), config, on_ready=freeze_heap)
    except BadInput:
        raise
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError) as e:
        raise BadInput(f"not a usable cluster snapshot: {type(e).__name__}: {e}",
                       source=path) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure(args.log_level)
    diagnose.install("extender")
    try:
        overrides = [parse_assignment(a) for a in args.assignments]
        for flag, path in (("host", "server.host"), ("port", "server.port"),
                           ("url_prefix", "server.url_prefix"), ("policy", "policy"),
                           ("bind", "bind.enabled"), ("threads", "server.threads")):
            value = getattr(args, flag)
            if value is not None:
                overrides.append((path, str(value)))
        config = load_config(args.config, overrides=overrides)
        if args.print_config:
            print(yaml.safe_dump(config_to_mapping(config), sort_keys=False), end="")
            return EXIT_OK
        if args.cluster_snapshot:
            runtime = _snapshot_runtime(args.cluster_snapshot, config)
            source = f"snapshot {args.cluster_snapshot}"
        else:
            runtime = cluster_runtime(lambda: api_client(args.kubeconfig, args.context), config,
                                      on_ready=freeze_heap)
            source = f"kubeconfig {args.kubeconfig}" if args.kubeconfig else "in-cluster"
    except BadInput as e:
        print(f"gpufrag extender: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    server = config.server
    structlog.get_logger("gpufrag.extender").info(
        "extender starting", source=source, policy=config.policy,
        address=f"{server.host}:{server.port}", tls=server.tls,
        client_certificates=bool(server.tls_client_ca_file),
        health_address=(f"{server.health_host}:{server.health_port}" if server.health_port
                        else None),
        url_prefix=server.url_prefix, bind=config.bind.enabled,
        nodes=runtime.cache.counts()["nodes"])
    try:
        serve(runtime, server)
    except ListenError as e:
        print(f"gpufrag extender: {e}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
