"""An API server in memory, under the real `Kube` (its retries, its 404 handling): the requests
it answered, the objects it holds, and failures injected on chosen requests.

`Kube` talks through the dynamic client (`resources.get(...).server_side_apply / delete /
create`, `.status.server_side_apply`) and reads ControllerRevisions and Secrets through the
typed clients; `kube(api)` wires a real `Kube` to this fake in their place. `no_backoff` keeps
its retries from sleeping.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from specfleet.controller.kube import Kube

Body = dict[str, Any]
TIMEOUT = "timeout"
"""A failure that is no answer: the connection's read timed out."""
REASONS = {403: "Forbidden", 404: "Not Found", 409: "Conflict", 500: "Internal Server Error"}


@dataclass
class Failure:
    """The next `times` requests of `verb` (apply, delete, status, event, read) on objects matching
    `target` (`Kind/name`, a glob) fail with `answer`: an HTTP status, or TIMEOUT."""

    verb: str
    target: str
    answer: int | str
    times: int = 1
    body: str = ""
    """The API server's Status; a plain one by default."""

    def matches(self, verb: str, target: str) -> bool:
        return self.times > 0 and verb == self.verb and fnmatch.fnmatchcase(target, self.target)

    def error(self) -> Exception:
        if self.answer == TIMEOUT:
            pool = urllib3.HTTPSConnectionPool("10.96.0.1", 443)
            return urllib3.exceptions.ReadTimeoutError(pool, "/apis", "Read timed out.")
        status = int(self.answer)
        reason = REASONS.get(status, "Error")
        exc = ApiException(status=status, reason=reason)
        exc.body = self.body or json.dumps(
            {"kind": "Status", "status": "Failure", "message": reason, "code": status}
        )
        return exc


@dataclass(frozen=True)
class Request:
    verb: str
    target: str
    """`Kind/name`."""
    body: Body | None
    failed: int | str | None
    """The injected failure it was answered with; None: it succeeded."""


@dataclass
class FakeApi:
    """What the API server holds, by (kind, name) in one namespace, and every request it saw."""

    objects: dict[tuple[str, str], Body] = field(default_factory=dict)
    statuses: dict[tuple[str, str], Body] = field(default_factory=dict)
    events: list[Body] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def answer(self, verb: str, target: str, body: Body | None = None) -> None:
        """Records the request; raises the injected failure, if one matches."""
        failure = next((f for f in self.failures if f.matches(verb, target)), None)
        self.requests.append(Request(verb, target, body, failure.answer if failure else None))
        if failure is not None:
            failure.times -= 1
            raise failure.error()

    # what the dynamic client does
    def apply(self, body: Body, **kwargs: Any) -> Response:
        kind, name = body["kind"], body["metadata"]["name"]
        self.answer("apply", f"{kind}/{name}", body)
        self.objects[(kind, name)] = copy.deepcopy(body)
        return Response()

    def delete(self, kind: str, name: str, **kwargs: Any) -> Response:
        self.answer("delete", f"{kind}/{name}")
        if (kind, name) not in self.objects:
            raise ApiException(status=404, reason="Not Found")
        del self.objects[(kind, name)]
        return Response()

    def apply_status(self, body: Body, **kwargs: Any) -> Response:
        kind, name = body["kind"], body["metadata"]["name"]
        self.answer("status", f"{kind}/{name}", body["status"])
        self.statuses[(kind, name)] = copy.deepcopy(body["status"])
        return Response()

    def create_event(self, body: Body, **kwargs: Any) -> Response:
        self.answer("event", f"Event/{body['reason']}", body)
        self.events.append(copy.deepcopy(body))
        return Response()

    def read_revision(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.answer("read", f"ControllerRevision/{name}")
        found = self.objects.get(("ControllerRevision", name))
        if found is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=copy.deepcopy(found["data"]))

    def read_event(self, name: str) -> Response:
        """A decision's Event looked for by the name its idempotency key gives it."""
        self.answer("read", f"Event/{name}")
        if not any(e["metadata"]["name"] == name for e in self.events):
            raise ApiException(status=404, reason="Not Found")
        return Response()

    def read_secret(self, name: str, namespace: str, **kwargs: Any) -> Any:
        raise ApiException(status=404, reason="Not Found")


class Response:
    """A write's answer, left unread (`serialize=False`)."""

    def drain_conn(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


@dataclass
class Resource:
    api: FakeApi
    kind: str

    def server_side_apply(self, body: Body, **kwargs: Any) -> Response:
        return self.api.apply(body, **kwargs)

    def delete(self, name: str, **kwargs: Any) -> Response:
        return self.api.delete(self.kind, name, **kwargs)

    def create(self, body: Body, **kwargs: Any) -> Response:
        assert self.kind == "Event"
        return self.api.create_event(body, **kwargs)

    def get(self, name: str, **kwargs: Any) -> Response:
        assert self.kind == "Event"
        return self.api.read_event(name)

    @property
    def status(self) -> Any:
        return SimpleNamespace(server_side_apply=self.api.apply_status)


def kube(api: FakeApi) -> Kube:
    """A real `Kube` whose clients are `api`."""
    real = Kube.__new__(Kube)
    real._gate = lambda: None
    resources = SimpleNamespace(get=lambda api_version, kind: Resource(api, kind))
    real._dynamic = SimpleNamespace(resources=resources)  # type: ignore[assignment]
    real._apps = SimpleNamespace(  # type: ignore[assignment]
        read_namespaced_controller_revision=api.read_revision
    )
    real._core = SimpleNamespace(read_namespaced_secret=api.read_secret)  # type: ignore[assignment]
    return real


def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Kube`'s retries, without their sleeps."""
    retried = [method for method in vars(Kube).values() if hasattr(method, "retry")]
    assert retried, "Kube retries nothing?"
    for method in retried:
        monkeypatch.setattr(method.retry, "sleep", lambda seconds: None)
