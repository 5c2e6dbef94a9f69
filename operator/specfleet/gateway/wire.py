"""What the gateway changes on the wire, as pure functions: forwarded headers, the usage
option it adds to streams, and its own errors in the engines' OpenAI format."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade",
    }
)  # fmt: skip


def openai_error(status: int, message: str, err_type: str) -> web.Response:
    """An error in the engines' OpenAI format (vLLM's: `code` is the HTTP status)."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return web.json_response(body, status=status)


def too_large(limit: int) -> web.Response:
    response = openai_error(
        413, f"request body is larger than {limit} bytes", "RequestEntityTooLargeError"
    )
    response.force_close()  # the unread rest of the body cannot be reused as a next request
    return response


def upstream_failure(exc: BaseException) -> web.Response:
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return openai_error(502, f"engine unreachable: {exc}", "BadGatewayError")
    if isinstance(exc, TimeoutError):
        return openai_error(504, "engine did not answer in time", "GatewayTimeoutError")
    return openai_error(502, f"engine connection failed: {exc}", "BadGatewayError")


def upstream_headers(headers: Mapping[str, str], identity: bool) -> CIMultiDict[str]:
    # aiohttp has already answered `Expect: 100-continue` and decompressed the body.
    dropped = {"host", "content-length", "expect", "content-encoding"}
    out = _without_hop_by_hop(headers, dropped)
    if identity:  # the gateway must read what the engine says
        out["Accept-Encoding"] = "identity"
    return out


def response_headers(headers: Mapping[str, str], keep_length: bool) -> CIMultiDict[str]:
    return _without_hop_by_hop(headers, set() if keep_length else {"content-length"})


def _without_hop_by_hop(headers: Mapping[str, str], extra: set[str]) -> CIMultiDict[str]:
    dropped = HOP_BY_HOP | extra
    connection = headers.get("Connection")
    if connection:
        dropped = dropped | {t.strip().lower() for t in connection.split(",")}
    out: CIMultiDict[str] = CIMultiDict()
    items = headers.items()
    for key, value in items:
        if key.lower() not in dropped:
            out.add(key, value)
    return out


def parse_object(raw: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


USAGE_OPTIONS = b'"stream_options":{"include_usage":true,"continuous_usage_stats":false},'


def usage_injection(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """The body to send upstream when a stream needs its final usage chunk (usage, vLLM's
    per-request metrics) and the engine would not send it; None when nothing changes.

    Both engines default `stream_options.include_usage` to true once `stream_options` is
    present, so only an absent `stream_options` or an explicit false/null needs the injection.
    continuous_usage_stats is turned off with it: the engines honour it only together with
    include_usage, so without the gateway the client would have seen no usage on any chunk.
    The usual case (no `stream_options`) splices the option in rather than re-encoding what
    may be a long prompt."""
    if body.get("stream") is not True:
        return None
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage", True):
        return None
    if "stream_options" not in body:
        start = len(raw) - len(raw.lstrip())
        if raw[start : start + 1] == b"{":
            return raw[: start + 1] + USAGE_OPTIONS + raw[start + 1 :]
    new_options = dict(options) if isinstance(options, dict) else {}
    new_options["include_usage"] = True
    new_options["continuous_usage_stats"] = False
    return json.dumps({**body, "stream_options": new_options}).encode()


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    return "client_error" if status < 500 else "upstream_error"
