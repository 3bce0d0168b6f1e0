"""``gpufrag admission``: serve the right-sizing mutating webhook (``POST /mutate``, HTTPS).

Exit 0 on SIGTERM/SIGINT, 1 when it cannot listen or has no cluster credentials, 2 on bad flags
or certificate files that cannot be loaded (one line on stderr).
"""

from __future__ import annotations

import argparse
import ssl
import sys
from collections.abc import Sequence

import structlog

from defrag.admission.server import AdmissionServer
from defrag.admission.templates import TemplateClient
from defrag.rightsizing.workloads import WorkloadClient
from gpufrag import diagnose, logs
from gpufrag.conventions import names_from_environ
from gpufrag.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_OK, BadInput, BadInputArgumentParser
from gpufrag.httpserve import ListenError
from scheduler.kube.client import api_client

PROG = "gpufrag admission"


def build_parser() -> argparse.ArgumentParser:
    p = BadInputArgumentParser(prog=PROG, description=(
        "Serve the GPU right-sizing mutating admission webhook: pods of workloads in auto "
        "mode get the GPU share their controller's recommendation says (never above what "
        "they asked, never below the observed peak). On POST /mutate-dra (namespaces with "
        "DRA delivery) it also moves GPU asks into ResourceClaims made from templates it "
        "creates."))
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")
    p.add_argument("--port", type=int, default=8443, help="HTTPS port (default: 8443)")
    p.add_argument("--tls-cert-file", help="serving certificate (PEM); required unless "
                                           "--insecure-http")
    p.add_argument("--tls-key-file", help="its private key (PEM)")
    p.add_argument("--insecure-http", action="store_true",
                   help="plain HTTP, for local tests only (the API server refuses it)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--lookup-timeout-s", type=float, default=2.0,
                   help="timeout of each read of a pod's controller and of each read or "
                        "create of a ResourceClaimTemplate (default: 2; keep it under the "
                        "webhook's timeoutSeconds)")
    p.add_argument("--log-level", default=None, help="debug, info, warning, error")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if not args.insecure_http and not (args.tls_cert_file and args.tls_key_file):
            raise BadInput("--tls-cert-file and --tls-key-file are required (the API server "
                           "calls webhooks over HTTPS); --insecure-http for local tests")
        if not 0 <= args.port <= 65535:
            raise BadInput(f"{args.port} is not a port (0..65535)", field="--port")
        if not 0 < args.lookup_timeout_s <= 30:
            raise BadInput(f"{args.lookup_timeout_s} must be in (0, 30]",
                           field="--lookup-timeout-s")
        names = names_from_environ()
    except BadInput as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logs.configure(args.log_level)
    diagnose.install("admission")
    log = structlog.get_logger("gpufrag.admission")
    try:
        api = api_client(args.kubeconfig, args.context)
        client = WorkloadClient(api, timeout_s=args.lookup_timeout_s)
        templates = TemplateClient(api, timeout_s=args.lookup_timeout_s)
    except Exception as e:
        print(f"{PROG}: no usable cluster credentials: {e}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        server = AdmissionServer(
            (args.host, args.port), resolve=client.resolve, names=names, templates=templates,
            cert_file=None if args.insecure_http else args.tls_cert_file,
            key_file=None if args.insecure_http else args.tls_key_file)
    except (ssl.SSLError, FileNotFoundError, IsADirectoryError) as e:
        print(f"{PROG}: cannot load the TLS certificate/key: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ListenError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_FAILURE
    log.info("admission_starting", address=f"{args.host}:{server.port}",
             tls=not args.insecure_http)
    server.run(signals=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
