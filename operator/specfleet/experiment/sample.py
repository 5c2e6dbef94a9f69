"""The capacity phase's sample of prompts: the requests a fleet gateway kept while it mirrored
(`GET /mirror/sample` on its metrics port), taken from one Ready fleet pod and made a request
file the load tests replay, within what a ConfigMap holds. Pure but for `get_sample`.

A request file has one API and no prompt in two classes (`replay.check_requests`): the sample
keeps its most common API and drops the prompts two classes share."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, zip_longest
from typing import Any

import httpx
from pydantic import ValidationError

from specfleet.api.gateway import SAMPLE_EXPERIMENT_HEADER, SAMPLE_PATH
from specfleet.experiment.replay import ReplayRequest, request_line
from specfleet.render.workload import ENGINE_APP, GATEWAY_METRICS_PORT

TIMEOUT_SECONDS = 5.0
MAX_SAMPLE_BYTES = 4 * 1024 * 1024
"""Of a gateway's answer; more is refused (it keeps a quarter of this)."""
REQUESTS_BYTES = 1024 * 1024 - 64 * 1024
"""The request file's: a ConfigMap holds 1 MiB, its metadata included."""
PODS_TRIED = 3

Body = dict[str, Any]
SampleFetch = Callable[[str, str, str], str]
"""(URL, experiment, token) -> the JSONL the gateway kept for that experiment."""


class SampleUnavailable(Exception):
    pass


def sample_urls(pods: Iterable[Body]) -> list[str]:
    """The sample's URL on the fleet's Ready pods (not a canary's: only the fleet mirrors), by
    name, the first few."""
    ready = sorted(
        (p for p in pods if _fleet(p) and _ready(p)), key=lambda p: p["metadata"]["name"]
    )
    return [_url(p["status"]["podIP"]) for p in ready[:PODS_TRIED]]


def take_sample(
    urls: Sequence[str], experiment: str, token: str, fetch: SampleFetch
) -> list[ReplayRequest]:
    """The first pod's sample that holds a request to replay; SampleUnavailable with every
    pod's words when none does."""
    problems = []
    for url in urls:
        try:
            return replayable(fetch(url, experiment, token))
        except SampleUnavailable as exc:
            problems.append(f"{url}: {exc}")
    raise SampleUnavailable("; ".join(problems) or "no Ready pod of the fleet")


def replayable(jsonl: str, budget: int = REQUESTS_BYTES) -> list[ReplayRequest]:
    """The sample as a request file of at most `budget` bytes, the classes interleaved so that
    a file cut short keeps each of them."""
    parsed = [r for line in jsonl.splitlines() if (r := _parse(line)) is not None]
    if not parsed:
        raise SampleUnavailable(f"no request to replay in {len(jsonl.splitlines())} lines kept")
    [(api, _)] = Counter(r.api for r in parsed).most_common(1)
    same_api = [r for r in parsed if r.api == api]
    classes: dict[str, set[str]] = {}
    for request in same_api:
        classes.setdefault(request.key, set()).add(request.class_name)
    by_class: dict[str, list[ReplayRequest]] = {}
    for request in same_api:
        if len(classes[request.key]) == 1:
            by_class.setdefault(request.class_name, []).append(request)
    kept = _within(chain.from_iterable(zip_longest(*by_class.values())), budget)
    if not kept:
        raise SampleUnavailable("every prompt kept was in two classes or over the budget")
    return kept


def _within(requests: Iterable[ReplayRequest | None], budget: int) -> list[ReplayRequest]:
    kept, size = [], 0
    for request in requests:
        if request is None:
            continue
        line = len(request_line(request).encode())
        if size + line <= budget:
            kept.append(request)
            size += line
    return kept


def _parse(line: str) -> ReplayRequest | None:
    try:
        return ReplayRequest.model_validate_json(line)
    except ValidationError:
        return None


def get_sample(http: httpx.Client, url: str, experiment: str, token: str) -> str:
    """The JSONL a gateway kept for `experiment`; SampleUnavailable with the words otherwise."""
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with http.stream("GET", url, headers=headers, timeout=TIMEOUT_SECONDS) as response:
            if response.status_code != 200:
                raise SampleUnavailable(f"HTTP {response.status_code}")
            kept_for = response.headers.get(SAMPLE_EXPERIMENT_HEADER)
            if kept_for != experiment:
                raise SampleUnavailable(f"the sample is experiment {kept_for}'s")
            return _read_capped(response).decode(errors="replace")
    except httpx.HTTPError as exc:
        raise SampleUnavailable(f"{type(exc).__name__}: {exc}") from None


def _read_capped(response: httpx.Response) -> bytes:
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_SAMPLE_BYTES:
            raise SampleUnavailable(f"more than {MAX_SAMPLE_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _fleet(pod: Body) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/name") == ENGINE_APP


def _ready(pod: Body) -> bool:
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and bool(status.get("podIP"))


def _url(ip: str) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{GATEWAY_METRICS_PORT}{SAMPLE_PATH}"
