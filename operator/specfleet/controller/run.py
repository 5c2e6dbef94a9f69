"""`specfleet run`: the operator, with every kopf setting chosen here rather than by flags."""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import kopf
from prometheus_client import start_http_server

from specfleet.alerts.receivers import Alertmanager, Receiver
from specfleet.alerts.sender import AlertSender
from specfleet.cluster_access import api_client, cluster_needed
from specfleet.controller import admission
from specfleet.controller.kube import Kube
from specfleet.controller.leader import Elector, KubeLeases, Leadership, Timings
from specfleet.controller.metrics import REGISTRY
from specfleet.controller.operator import Operator
from specfleet.render import RenderSettings
from specfleet.render.plan import DEFAULT_CAPACITY_IMAGE, DEFAULT_GATEWAY_IMAGE
from specfleet.telemetry.reader import TelemetryReader


@dataclass(frozen=True)
class RunOptions:
    namespaces: list[str] = field(default_factory=list)
    metrics_port: int = 9090
    health_port: int = 8081
    log_format: str = "text"
    log_level: str = "info"
    gateway_image: str = DEFAULT_GATEWAY_IMAGE
    capacity_image: str = DEFAULT_CAPACITY_IMAGE
    resync_seconds: float = 300.0
    bind_address: str = "0.0.0.0"
    prometheus_url: str | None = None
    alertmanager_url: str | None = None
    guard_tick_seconds: float = 5.0
    webhook_port: int | None = None
    webhook_cert: str | None = None
    webhook_key: str | None = None
    leader_elect: bool = False
    lease_name: str = "specfleet-operator"
    lease_namespace: str | None = None
    """Default: $POD_NAMESPACE, else the ServiceAccount's namespace, else `default`."""
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


class NoEssence(kopf.AnnotationsDiffBaseStorage):
    """specfleet registers no change-detecting handlers (on.create / update / field, daemons,
    timers), so kopf never compares two essences of an object; building one deep-copies every
    watch event's body, a tenth of the operator's CPU while a fleet comes up."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


YOUNG_COLLECTION_THRESHOLD = 50_000
"""Net container allocations between young-generation collections (CPython's default: 700)."""


def tune_collector() -> None:
    """For the operator's own process (not a test's that runs `run` in a thread). Everything
    loaded by startup lives as long as the process: frozen, full collections do
    not rescan it. A guard tick over 1000 SpecModels allocates hundreds of thousands of
    short-lived tuples and dicts; at CPython's default threshold the collector ran about 35
    times per tick and took a fifth of it (bench/guard_latency.py). Cyclic garbage waits a
    little longer: most of ours is freed by reference counting the moment it is dropped."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])


def settings(webhook: kopf.WebhookServer | None = None) -> kopf.OperatorSettings:
    result = kopf.OperatorSettings()
    result.admission.server = webhook
    result.persistence.diffbase_storage = NoEssence()
    result.peering.standalone = True  # one operator pod; no KopfPeering CRDs needed
    result.posting.enabled = False  # our own Events carry stable reasons; kopf's would be noise
    result.watching.server_timeout = 300
    result.watching.client_timeout = 330
    result.execution.max_workers = 8
    result.networking.request_timeout = 60
    return result


def webhook_server(options: RunOptions) -> kopf.WebhookServer | None:
    """The admission webhook's server, when `specfleet run` serves one."""
    if not (options.webhook_port and options.webhook_cert and options.webhook_key):
        return None
    return admission.server(
        options.bind_address, options.webhook_port, options.webhook_cert, options.webhook_key
    )


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def identity() -> str:
    """This replica's name in the Lease: its pod's (the chart sets $POD_NAME), else the host's
    and the process's."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


def lease_namespace(options: RunOptions) -> str:
    if options.lease_namespace:
        return options.lease_namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if SERVICE_ACCOUNT_NAMESPACE.exists():
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    return "default"


def leadership_for(options: RunOptions) -> Leadership | None:
    """With --leader-elect, this replica's candidacy for the Lease (started with the operator's
    loops); without, None: it acts alone, as before."""
    if not options.leader_elect:
        return None
    timings = Timings(options.lease_seconds, options.renew_deadline_seconds, options.retry_seconds)
    leases = KubeLeases(
        api_client(), lease_namespace(options), options.lease_name, timings.retry_seconds
    )
    return Leadership(Elector(identity(), leases, timings))


def operator_for(options: RunOptions, leadership: Leadership | None = None) -> Operator:
    http = httpx.Client()
    receivers: list[Receiver] = []
    if options.alertmanager_url:
        receivers.append(Alertmanager(options.alertmanager_url, http))
    if options.prometheus_url is None:
        logging.getLogger(__name__).warning("no --prometheus-url: the guard is off")
    return Operator(
        Kube(api_client(), gate=leadership.check if leadership else None),
        RenderSettings(gateway_image=options.gateway_image, capacity_image=options.capacity_image),
        reader=TelemetryReader(options.prometheus_url) if options.prometheus_url else None,
        alerts=AlertSender(may_send=leadership.leading if leadership else lambda: True),
        receivers=receivers,
    )


def run(
    options: RunOptions,
    stop_flag: threading.Event | None = None,
    ready_flag: threading.Event | None = None,
) -> None:
    import specfleet.controller.handlers  # noqa: F401  (registers the handlers)

    kopf.configure(
        log_format=kopf.LogFormat.JSON if options.log_format == "json" else kopf.LogFormat.PLAIN,
        verbose=options.log_level == "debug",
        quiet=options.log_level in ("warning", "error"),
    )
    logging.getLogger().setLevel(options.log_level.upper())
    if options.metrics_port:
        start_http_server(options.metrics_port, addr=options.bind_address, registry=REGISTRY)
    with cluster_needed("specfleet run"):  # a kubeconfig or a ServiceAccount, an API server
        leadership = leadership_for(options)
        operator = operator_for(options, leadership)  # discovery: the API server's first request
    webhook = webhook_server(options)
    if webhook is not None:
        admission.register()  # kopf refuses an admission handler without a server
    kopf.run(
        settings=settings(webhook),
        standalone=True,
        namespaces=options.namespaces,
        clusterwide=not options.namespaces,
        liveness_endpoint=f"http://{options.bind_address}:{options.health_port}/healthz",
        memo=kopf.Memo(
            operator=operator,
            leadership=leadership,
            resync_seconds=options.resync_seconds,
            guard_tick_seconds=options.guard_tick_seconds,
        ),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
