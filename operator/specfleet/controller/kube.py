"""The operator's writes to the API server: server-side apply (one field manager), deletes,
status, ControllerRevisions and Events. Sync (kubernetes client); call it from threads.

Transient failures (conflicts, throttling, server errors, dropped connections) are retried
with exponential backoff; anything else surfaces to the caller, which records it in status.

Writes go through the dynamic client with plain dicts and leave the response unparsed
(`serialize=False`): the operator never reads what a write returns, and building client
models for bodies and responses was a fifth of its CPU while a fleet came up.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from tenacity import (
    retry,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from specfleet.api import API_VERSION, KIND
from specfleet.controller.metrics import API_WRITES

FIELD_MANAGER = "specfleet"
TRANSIENT_STATUS = {409, 429, 500, 502, 503, 504}
Body = dict[str, Any]
log = logging.getLogger(__name__)


UNANSWERED = (urllib3.exceptions.HTTPError, ConnectionError)
"""A request the API server never answered: timed out, refused, dropped. Transient."""


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status in TRANSIENT_STATUS
    return isinstance(exc, UNANSWERED)


_retry = retry(
    retry=retry_if_exception(_transient),
    wait=wait_exponential_jitter(multiplier=0.2, max=5),
    stop=stop_after_attempt(5),
    reraise=True,
)


def _discard(response: urllib3.BaseHTTPResponse) -> None:
    """A write's response, read to its end unparsed, so its connection goes back to the pool
    (an unread one is dropped, and the next request pays a new TLS handshake)."""
    response.drain_conn()
    response.release_conn()


class Kube:
    """Writes, counted by verb (`specfleet_api_writes_total`) so an idle operator's silence can
    be proven."""

    def __init__(self, api: client.ApiClient, gate: Callable[[], None] | None = None) -> None:
        """`gate`: called before every write; raises (leader.NotLeading) when this replica
        must not write, e.g. it lost the Lease mid-reconcile."""
        self._gate = gate or (lambda: None)
        self._dynamic = DynamicClient(api)
        self._core = client.CoreV1Api(api)
        self._apps = client.AppsV1Api(api)

    def _resource(self, api_version: str, kind: str) -> Any:
        return self._dynamic.resources.get(api_version=api_version, kind=kind)

    @_retry
    def apply(self, manifest: Body) -> None:
        self._gate()
        API_WRITES.labels(manifest["metadata"].get("namespace", ""), "apply").inc()
        resource = self._resource(manifest["apiVersion"], manifest["kind"])
        response = resource.server_side_apply(
            body=manifest,
            namespace=manifest["metadata"].get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            serialize=False,
        )
        _discard(response)

    @_retry
    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self._gate()
        API_WRITES.labels(namespace, "delete").inc()
        try:
            # a Job's pods go with it (the API's default for Jobs orphans them)
            self._resource(api_version, kind).delete(
                name=name, namespace=namespace, propagation_policy="Background"
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    @_retry
    def apply_status(self, namespace: str, name: str, status: Body, kind: str = KIND) -> None:
        """The status of a SpecModel, or of another specfleet resource (`kind`)."""
        self._gate()
        API_WRITES.labels(namespace, "status").inc()
        body = {
            "apiVersion": API_VERSION,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "status": status,
        }
        resource = self._resource(API_VERSION, kind)
        try:
            response = resource.status.server_side_apply(
                body=body,
                namespace=namespace,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
                serialize=False,
            )
            _discard(response)
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing left to describe
                raise

    @_retry
    def read_revision(self, namespace: str, name: str) -> Body:
        revision = self._apps.read_namespaced_controller_revision(name, namespace)
        data: Body = revision.data
        return data

    @_retry
    def read_secret(self, namespace: str, name: str, key: str) -> str:
        secret = self._core.read_namespaced_secret(name, namespace)
        encoded = (secret.data or {}).get(key)
        if encoded is None:
            raise KeyError(f"Secret {namespace}/{name} has no key {key!r}")
        return base64.b64decode(encoded).decode().strip()

    @_retry
    def event_exists(self, namespace: str, name: str) -> bool:
        """Whether the Event `name` was posted (a read: a decision's Event, by its key)."""
        try:
            resource = self._resource("v1", "Event")
            _discard(resource.get(name=name, namespace=namespace, serialize=False))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def event(
        self, involved: Body, kind: str, reason: str, message: str, name: str | None = None
    ) -> None:
        """Best effort: an Event the API server refuses, or keeps failing or not answering
        through the retries, is logged and dropped; it never fails the reconcile that tells it
        (a gone or terminating namespace, an overloaded API server). `name`: a decision's
        Event, named by its idempotency key; one posted already (409) is not posted again."""
        self._gate()
        try:
            self._post_event(involved, kind, reason, message, name)
        except (ApiException, *UNANSWERED) as exc:
            level = logging.WARNING if _transient(exc) else logging.INFO
            name = involved["metadata"]["name"]
            why = exc.reason if isinstance(exc, ApiException) else exc
            log.log(level, "event %s for %s not posted: %s", reason, name, why)

    @_retry
    def _post_event(
        self, involved: Body, kind: str, reason: str, message: str, name: str | None
    ) -> None:
        API_WRITES.labels(involved["metadata"]["namespace"], "event").inc()
        meta = involved["metadata"]
        now = datetime.now(UTC).isoformat(timespec="seconds")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name or f"{meta['name']}.{uuid.uuid4().hex[:12]}"},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", API_VERSION),
                "kind": involved.get("kind", KIND),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": FIELD_MANAGER,
            "action": reason,
        }
        try:
            response = self._resource("v1", "Event").create(
                body=event, namespace=meta["namespace"], serialize=False
            )
            _discard(response)
        except ApiException as exc:
            if exc.status == 409 and name is not None:
                log.info("event %s for %s was posted already (%s)", reason, meta["name"], name)
                return
            raise
