"""What a `specfleet` command that talks to the API server says when it cannot: one line naming
what it needs (a kubeconfig, an API server that answers, credentials it accepts), exit 2.

The one place that turns the kubernetes client's ways of failing (`ConfigException`, urllib3's
`MaxRetryError` around a refused connection or a TLS failure, a 401 or 403 `ApiException`)
into that line. Imported only by commands that need a cluster (it imports the client).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import NoReturn

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException

from specfleet.refusal import refuse_without

NEEDS = "a Kubernetes cluster"
REFUSED_CREDENTIALS = 401
FORBIDDEN = 403
NOT_ALLOWED = {REFUSED_CREDENTIALS, FORBIDDEN}
"""The statuses that say the kubeconfig's user, not the request, is the problem."""


@contextmanager
def cluster_needed(command: str, offline: str | None = None) -> Iterator[None]:
    """Around the code that loads the kubeconfig and talks to the API server: its failure to
    reach one becomes `error: COMMAND needs a Kubernetes cluster: WHY[; OFFLINE]`, exit 2.
    Any other failure (a 404, a bug) passes through."""
    try:
        yield
    except ConfigException as exc:
        _refuse(command, f"no usable kubeconfig ({_kubeconfig()}: {_one_line(exc)})", offline)
    except ApiException as exc:
        if exc.status not in NOT_ALLOWED:
            raise
        _refuse(command, _not_allowed(exc), offline)
    except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
        _refuse(command, f"nothing answers at {_server(exc)} ({_reason(exc)})", offline)


def _refuse(command: str, problem: str, offline: str | None) -> NoReturn:
    refuse_without(command, NEEDS, f"{problem}; {offline}" if offline else problem)


def _kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG")
    return f"$KUBECONFIG={path}" if path else "$KUBECONFIG unset, ~/.kube/config"


def _server(exc: BaseException) -> str:
    pool = getattr(exc, "pool", None)
    if pool is not None and getattr(pool, "host", None):
        return f"{pool.scheme}://{pool.host}:{pool.port}"
    return str(client.Configuration.get_default_copy().host)


def _reason(exc: BaseException) -> str:
    """The innermost cause a person recognises: `Connection refused`, a TLS verify failure."""
    seen: BaseException | None = getattr(exc, "reason", None) or exc
    last = seen
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        last = seen
        seen = seen.__cause__ or seen.__context__
    return _one_line(last)


def _not_allowed(exc: ApiException) -> str:
    server = client.Configuration.get_default_copy().host
    if exc.status == REFUSED_CREDENTIALS:
        return f"{server} refused the kubeconfig's credentials ({_kubeconfig()}): 401 Unauthorized"
    message = ""
    with suppress(ValueError, AttributeError):  # not the API server's JSON Status
        message = str(json.loads(exc.body or "{}").get("message", ""))
    return f"the kubeconfig's user may not do this at {server}: {message or '403 Forbidden'}"


def _one_line(exc: BaseException | None) -> str:
    return " ".join(str(exc).split())


def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # The client reads $KUBECONFIG at import time; read it now.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient()
