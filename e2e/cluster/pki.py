"""Certificates (openssl) and kubeconfigs for the local cluster's components and users."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "3650"
APISERVER_SANS = (
    "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
    "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
)


@dataclass(frozen=True)
class Identity:
    """A client certificate: the user name (CN) and groups (O) the API server sees."""

    name: str
    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("admin", "specfleet-e2e-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("controller-manager", "system:kube-controller-manager")
SCHEDULER = Identity("scheduler", "system:kube-scheduler")
PROMETHEUS = Identity("prometheus", "specfleet-e2e-prometheus")
IDENTITIES = (ADMIN, CONTROLLER_MANAGER, SCHEDULER, PROMETHEUS)


def ensure_pki(pki: Path) -> None:
    """Creates the CA, the API server's serving cert, the SA signing key and client certs once."""
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            DAYS,
            "-subj",
            "/CN=specfleet-e2e-ca",
            "-keyout",
            pki / "ca.key",
            "-out",
            pki / "ca.crt",
        )
    if not (pki / "apiserver.crt").exists():
        _issue(pki, "apiserver", "/CN=kube-apiserver", f"subjectAltName={APISERVER_SANS}")
    if not (pki / "sa.pub").exists():
        _openssl("genpkey", "-algorithm", "RSA", "-out", pki / "sa.key")
        _openssl("pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
    for identity in IDENTITIES:
        if not (pki / f"{identity.name}.crt").exists():
            subject = f"/CN={identity.user}" + "".join(f"/O={g}" for g in identity.groups)
            _issue(pki, identity.name, subject, "extendedKeyUsage=clientAuth")


def write_kubeconfig(path: Path, server: str, pki: Path, identity: Identity) -> Path:
    """Writes a kubeconfig (JSON, which is valid YAML) for `identity`; returns its path."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "specfleet-e2e",
                "cluster": {"server": server, "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": identity.user,
                "user": {
                    "client-certificate": str(pki / f"{identity.name}.crt"),
                    "client-key": str(pki / f"{identity.name}.key"),
                },
            }
        ],
        "contexts": [
            {
                "name": "specfleet-e2e",
                "context": {"cluster": "specfleet-e2e", "user": identity.user},
            }
        ],
        "current-context": "specfleet-e2e",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def _issue(pki: Path, name: str, subject: str, extension: str) -> None:
    key, csr, crt = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.crt"
    _openssl(
        "req",
        "-new",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        subject,
        "-keyout",
        key,
        "-out",
        csr,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        pki / "ca.crt",
        "-CAkey",
        pki / "ca.key",
        "-CAcreateserial",
        "-days",
        DAYS,
        "-extfile",
        "/dev/stdin",
        "-out",
        crt,
        stdin=extension,
    )
    csr.unlink()


def _openssl(*args: str | Path, stdin: str | None = None) -> None:
    subprocess.run(
        ["openssl", *map(str, args)], input=stdin, text=True, check=True, capture_output=True
    )
