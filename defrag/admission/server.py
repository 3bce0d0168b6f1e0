"""The webhook's HTTPS server: ``POST /mutate``, ``GET /healthz``, ``GET /metrics``.

The standard library's threading HTTP server behind TLS (the API server only speaks HTTPS to
webhooks). The server certificate and key are files (mounted from a Secret that cert-manager,
or ``scripts``-style openssl, keeps; see docs/rightsizing.md) and are re-read when they change
on disk, so a renewed certificate is served without a restart. Each connection has a socket
timeout, so a stalled client holds a thread for at most that long; bodies above
:data:`MAX_BODY_BYTES` are refused.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import structlog
from prometheus_client import generate_latest

from defrag.admission.review import AdmissionMetrics, Resolver, answer
from gpufrag.conventions import KubeNames

MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server's own request limit for objects
CONNECTION_TIMEOUT_S = 10.0

log = structlog.get_logger("gpufrag.admission")


class _ReloadingContext:
    """An SSL context that loads the certificate again when its file's mtime changes."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        self._lock = threading.Lock()
        self._mtime = -1.0
        self.context = self._load()

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file)
        self._mtime = os.stat(self.cert_file).st_mtime
        return context

    def current(self) -> ssl.SSLContext:
        with self._lock, contextlib.suppress(OSError, ssl.SSLError):
            if os.stat(self.cert_file).st_mtime != self._mtime:
                self.context = self._load()
                log.info("certificate_reloaded", cert_file=self.cert_file)
        return self.context


class AdmissionServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, resolve: Resolver, names: KubeNames,
                 cert_file: str | None, key_file: str | None,
                 metrics: AdmissionMetrics | None = None) -> None:
        self.resolve, self.names = resolve, names
        self.metrics = metrics or AdmissionMetrics()
        self.tls = _ReloadingContext(cert_file, key_file) if cert_file and key_file else None
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        sock.settimeout(CONNECTION_TIMEOUT_S)
        if self.tls is not None:
            sock = self.tls.current().wrap_socket(sock, server_side=True,
                                                  do_handshake_on_connect=False)
        return sock, addr

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("connection_failed", client=str(client_address))

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Handler(BaseHTTPRequestHandler):
    server: AdmissionServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # structlog says what matters
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/healthz":
            self._send(200, b"ok\n", "text/plain")
        elif self.path == "/metrics":
            self._send(200, generate_latest(self.server.metrics.registry),
                       "text/plain; version=0.0.4")
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/mutate":
            self._send(404, b'{"error": "not found; the webhook path is /mutate"}')
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= MAX_BODY_BYTES:
            self._send(413 if length else 400, b'{"error": "body missing or too large"}')
            return
        body = self.rfile.read(length)
        try:
            review = answer(body, self.server.resolve, self.server.names, self.server.metrics)
        except (ValueError, orjson.JSONDecodeError) as e:
            self._send(400, orjson.dumps({"error": str(e)}))
            return
        self._send(200, orjson.dumps(review))
