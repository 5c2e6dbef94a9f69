"""Readiness probes for the local cluster's processes (stdlib HTTP, loopback only)."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from e2e.cluster import pki
from e2e.cluster.components import Layout

Probe = Callable[[], bool]


def opener(context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """An HTTP opener that never uses a proxy from the environment (everything is loopback)."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )


def http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    """True if `url` answers 200."""
    try:
        with opener(context).open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def admin_tls(layout: Layout) -> ssl.SSLContext:
    """Trusts the cluster CA and presents the admin client certificate."""
    context = ssl.create_default_context(cafile=str(layout.pki_dir / "ca.crt"))
    name = pki.ADMIN.name
    context.load_cert_chain(layout.pki_dir / f"{name}.crt", layout.pki_dir / f"{name}.key")
    return context


def self_signed_tls() -> ssl.SSLContext:
    """For kube-controller-manager and kube-scheduler, which serve self-signed /healthz."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def probes(layout: Layout) -> dict[str, Probe]:
    """One probe per process name: True once it serves."""
    ports, local = layout.ports, "http://127.0.0.1"
    return {
        "etcd": lambda: http_ok(f"{local}:{ports.etcd}/health"),
        "kube-apiserver": lambda: http_ok(f"{layout.api_server_url}/readyz", admin_tls(layout)),
        "kube-controller-manager": lambda: http_ok(
            f"https://127.0.0.1:{ports.controller_manager}/healthz", self_signed_tls()
        ),
        "kube-scheduler": lambda: http_ok(
            f"https://127.0.0.1:{ports.scheduler}/healthz", self_signed_tls()
        ),
        "kwok": lambda: http_ok(f"{local}:{ports.kwok}/healthz"),
        "webhook": lambda: http_ok(f"{local}:{ports.webhook}/healthz"),
        "alertmanager": lambda: http_ok(f"{local}:{ports.alertmanager}/-/ready"),
        "prometheus": lambda: http_ok(f"{local}:{ports.prometheus}/-/ready"),
    }


def wait_until(probe: Probe, what: str, log: Path | None, timeout_s: float = 60) -> None:
    """Polls `probe` until it passes; on timeout raises with the tail of `log`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace").splitlines()[-30:] if log and log.exists() else []
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f}s; log tail:\n" + "\n".join(tail))
