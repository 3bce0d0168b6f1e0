"""Server-side TLS whose certificate, key and client CA are read again when their files change:
the one home for it, used by every HTTPS listener of the project (the extender's verbs, the
admission webhook).

Certificates in a cluster are files mounted from a Secret that cert-manager (or an operator
with openssl) renews in place; a listener that loaded them once would serve an expired
certificate until restarted, and the extender's restart costs the whole cluster state.

How: the listener is given one context (:attr:`ServerTLS.context`) whose SNI callback, which
OpenSSL calls for every ClientHello with or without a server name (kube-scheduler sends none
to an IP), hands the new connection to the current context. At most every
:data:`RELOAD_EVERY_S` the files' modification times are compared, and when one changed a
fresh context is made from them as at start-up. Only a context that loaded whole replaces the
current one, so files caught half-written leave the old ones serving, and a client CA taken
out of its file is no longer trusted by the next handshakes.
"""

from __future__ import annotations

import os
import ssl
import threading
import time
from collections.abc import Callable

import structlog

RELOAD_EVERY_S = 10.0

log = structlog.get_logger("gpufrag.tls")


class ServerTLS:
    """TLS 1.2+ for a server: ``cert_file`` and ``key_file``; with ``client_ca_file`` every
    client must present a certificate signed by that CA, or the handshake fails before any
    request is read. ``alpn`` is what the listener offers (HTTP/1.1 only, the one protocol
    the project's servers are measured on). Raises ``OSError`` or ``ssl.SSLError`` when the
    files do not load at start-up."""

    def __init__(self, cert_file: str, key_file: str, client_ca_file: str = "", *,
                 alpn: tuple[str, ...] = ("http/1.1",),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file
        self.alpn = alpn
        self._clock = clock
        self._lock = threading.Lock()
        self.current = self.make_context()
        self._stamps = self._read_stamps()
        self._checked_at = clock()
        # The listener's context: the first one made, carrying the callback that hands each
        # handshake to whichever context is current (itself until the files change).
        self.context = self.current
        self.context.sni_callback = self._pick

    def make_context(self) -> ssl.SSLContext:
        """A fresh context from the files as they are now."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.options |= ssl.OP_NO_COMPRESSION
        context.set_alpn_protocols(list(self.alpn))
        context.load_cert_chain(certfile=self.cert_file, keyfile=self.key_file)
        if self.client_ca_file:
            context.load_verify_locations(cafile=self.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def _read_stamps(self) -> tuple[float, ...]:
        stamps = []
        for path in (self.cert_file, self.key_file, self.client_ca_file):
            if not path:
                continue
            try:
                stamps.append(os.stat(path).st_mtime)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)

    def maybe_reload(self) -> ssl.SSLContext:
        """The context for the next connection, made afresh when the files changed."""
        with self._lock:
            now = self._clock()
            if now - self._checked_at < RELOAD_EVERY_S:
                return self.current
            self._checked_at = now
            stamps = self._read_stamps()
            if stamps == self._stamps:
                return self.current
            try:
                fresh = self.make_context()
            except (OSError, ssl.SSLError) as e:  # half-written files: try again next time
                log.warning("TLS files changed but could not be loaded; still serving the old "
                            "ones", cert_file=self.cert_file, error=str(e))
                return self.current
            self.current, self._stamps = fresh, stamps
            log.info("TLS certificate reloaded", cert_file=self.cert_file)
            return fresh

    def _pick(self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None,
              _listening: ssl.SSLContext) -> None:
        connection.context = self.maybe_reload()


__all__ = ["RELOAD_EVERY_S", "ServerTLS"]
