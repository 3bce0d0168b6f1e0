"""``gpufrag export-snapshot``: write a live cluster's Nodes and Pods to a snapshot file.

The file (JSON, or YAML for ``.yaml``/``.yml``) is what ``gpufrag extender --cluster-snapshot``
reads: debug a scheduling decision offline, on exactly the state the cluster had.
``managedFields`` are dropped (they are most of an object's size and nothing reads them).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import kubernetes

from gpufrag.argtypes import positive_int
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput
from gpufrag.logs import configure
from scheduler.kube.client import api_client
from scheduler.kube.snapshot import write_snapshot
from scheduler.kube.watch import NON_TERMINAL_PODS, list_objects

Obj = Mapping[str, Any]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpufrag export-snapshot", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("output", help="file to write: .json, or .yaml/.yml for YAML")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else "
                                        "$KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--namespace", help="only pods of this namespace (default: all)")
    p.add_argument("--include-terminal", action="store_true",
                   help="also Succeeded/Failed pods (they hold no resources)")
    p.add_argument("--page-size", type=positive_int, default=500,
                   help="objects per list page (default: %(default)s)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure()
    try:
        client = api_client(args.kubeconfig, args.context)
        core = kubernetes.client.CoreV1Api(client)
        selector = None if args.include_terminal else NON_TERMINAL_PODS
        pods_call = (functools.partial(core.list_namespaced_pod, args.namespace,
                                       field_selector=selector) if args.namespace else
                     functools.partial(core.list_pod_for_all_namespaces,
                                       field_selector=selector))
        nodes, _ = list_objects(core.list_node, args.page_size, what="node", slim=True)
        pods, _ = list_objects(pods_call, args.page_size, what="pod", slim=True)
        count = write_snapshot(args.output, nodes, pods)
    except BadInput as e:
        print(f"gpufrag export-snapshot: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # API refusals, connection errors, an unwritable file
        print(f"gpufrag export-snapshot: failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"wrote {len(nodes)} nodes and {len(pods)} pods ({count} objects) to {args.output}")
    return EXIT_OK
