"""Socket checks for the HTTP tests that do not depend on what the kernel may choose.

A server that closes a connection whose client sent bytes it never read makes the kernel send
a reset instead of an orderly close (RFC 1122 4.2.2.13); whether the client then reads EOF or
``ConnectionResetError`` depends on timing. Both mean the same thing to a test: the server
closed the connection and sent nothing more.
"""

from __future__ import annotations

import socket


def closed_by_peer(sock: socket.socket, timeout_s: float = 3.0) -> bool:
    """True once the peer has closed ``sock`` (EOF or reset) with nothing more sent; False when
    it sends data or stays open for ``timeout_s``."""
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def send_and_read_to_close(port: int, data: bytes, timeout_s: float = 10.0) -> bytes:
    """What a server at 127.0.0.1:``port`` answers to the raw ``data`` before it closes the
    connection; a reset after the answer (the server closed with part of ``data`` unread)
    ends the read like an orderly close."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer
