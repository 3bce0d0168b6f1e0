"""Certificates and kubeconfigs for the local control plane (openssl on the command line)."""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import yaml

from devkit.procs import ControlPlaneError


def run_openssl(args: Sequence[str], cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_pki(pki_dir: Path, service_ip: str) -> None:
    """A CA, an API-server serving certificate signed by it, and a service-account key pair.

    Made with the openssl command line because it is everywhere the build can run and the
    ``cryptography`` package is not a dependency. RSA 2048 keeps it quick (well under a second).
    """
    if shutil.which("openssl") is None:
        raise ControlPlaneError("the 'openssl' command is needed to make the control plane's "
                                "certificates; install it (e.g. the openssl package)")
    pki_dir.mkdir(parents=True, exist_ok=True)
    run_openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                  "-out", "ca.crt", "-days", "3650", "-subj", "/CN=gpufrag-dev-ca",
                  "-addext", "basicConstraints=critical,CA:TRUE",
                  "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"], pki_dir)
    sans = ["IP:127.0.0.1", f"IP:{service_ip}", "DNS:localhost", "DNS:kubernetes",
            "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local"]
    (pki_dir / "apiserver.ext").write_text(
        f"subjectAltName={','.join(sans)}\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n")
    run_openssl(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
                  "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver"], pki_dir)
    run_openssl(["x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                  "-CAcreateserial", "-days", "3650", "-out", "apiserver.crt",
                  "-extfile", "apiserver.ext"], pki_dir)
    run_openssl(["genrsa", "-out", "sa.key", "2048"], pki_dir)
    run_openssl(["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"], pki_dir)


def kubeconfig_yaml(server: str, ca_pem: bytes, token: str) -> str:
    """An admin kubeconfig with the CA inlined, so the file can be copied elsewhere."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpufrag-dev", "cluster": {
            "server": server,
            "certificate-authority-data": base64.b64encode(ca_pem).decode("ascii")}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "gpufrag-dev", "context": {
            "cluster": "gpufrag-dev", "user": "admin", "namespace": "default"}}],
        "current-context": "gpufrag-dev",
    }
    return yaml.safe_dump(config, sort_keys=False)

