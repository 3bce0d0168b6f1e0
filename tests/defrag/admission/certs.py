"""A CA and a serving certificate for 127.0.0.1, made with openssl (as devkit/pki.py does)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def make_serving_cert(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.crt, tls.crt, tls.key) in ``directory``; the certificate is for 127.0.0.1/localhost."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    directory.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
            "ca.crt", "-days", "2", "-subj", "/CN=gpufrag-admission-test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")
    (directory / "tls.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "tls.key", "-out", "tls.csr",
            "-subj", "/CN=gpufrag-admission")
    openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", "tls.crt", "-extfile", "tls.ext")
    return directory / "ca.crt", directory / "tls.crt", directory / "tls.key"
