"""What the gateway changes on the wire, as pure functions: forwarded headers, the usage
option it adds to streams, and its own errors in the engines' OpenAI format."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from multidict import CIMultiDict

from specfleet.gateway.upstream import EngineUnreachable

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
        "proxy-connection", "te", "trailer", "trailers", "transfer-encoding", "upgrade",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Reply:
    """An answer the gateway gives itself, whole."""

    status: int
    body: bytes
    close: bool = False
    """Close the connection after it (what the client sent cannot be read past)."""
    content_type: str = "application/json"


def openai_error(status: int, message: str, err_type: str, close: bool = False) -> Reply:
    """An error in the engines' OpenAI format (vLLM's: `code` is the HTTP status)."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return Reply(status, json.dumps(body).encode(), close)


def too_large(limit: int) -> Reply:
    # The unread rest of the body cannot be reused as a next request: the connection closes.
    message = f"request body is larger than {limit} bytes"
    return openai_error(413, message, "RequestEntityTooLargeError", close=True)


def upstream_failure(exc: BaseException) -> Reply:
    unreachable = EngineUnreachable | aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError
    if isinstance(exc, unreachable):
        return openai_error(502, f"engine unreachable: {exc}", "BadGatewayError")
    if isinstance(exc, TimeoutError):
        return openai_error(504, "engine did not answer in time", "GatewayTimeoutError")
    return openai_error(502, f"engine connection failed: {exc}", "BadGatewayError")


# The gateway's server has already answered `Expect: 100-continue` and decoded the body.
_NOT_FORWARDED = HOP_BY_HOP | {"host", "content-length", "expect", "content-encoding"}
_NOT_RELAYED = HOP_BY_HOP | {"content-length"}


def upstream_headers(headers: Mapping[str, str], identity: bool) -> CIMultiDict[str]:
    out = _without(headers, _NOT_FORWARDED)
    if identity:  # the gateway must read what the engine says
        out["Accept-Encoding"] = "identity"
    return out


def response_headers(headers: Mapping[str, str]) -> CIMultiDict[str]:
    """The headers relayed to the client (the gateway's server writes the framing)."""
    return _without(headers, _NOT_RELAYED)


def _without(headers: Mapping[str, str], dropped: frozenset[str]) -> CIMultiDict[str]:
    """The headers less `dropped` and those the Connection header names."""
    connection = headers.get("Connection")
    if connection:
        dropped = dropped | {t.strip().lower() for t in connection.split(",")}
    out: CIMultiDict[str] = CIMultiDict()
    items = headers.items()
    for key, value in items:
        if key.lower() not in dropped:
            out.add(key, value)
    return out


MAX_BODY_DEPTH = 64
"""Deepest nesting of a request body: far beyond any real request's, well inside what the
JSON parser, the encoder and the schema checks can take."""
# Fields the gateway reads, and the JSON types it reads them as (null is always allowed).
_TYPED_FIELDS = (
    ("model", str, "a string"), ("stream", bool, "a boolean"),
    ("stream_options", dict, "an object"), ("tools", list, "an array"),
    ("response_format", dict, "an object"),
)  # fmt: skip


class BadRequest(Exception):
    """A request the gateway answers itself with 400: its message is the gateway's own words,
    never the client's bytes."""


def parse_request(raw: bytes) -> dict[str, Any]:
    """An inference request's body, or BadRequest."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(f"the body is nested more than {MAX_BODY_DEPTH} levels deep") from None
    except ValueError:
        raise BadRequest("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if raw.count(b"[") + raw.count(b"{") > MAX_BODY_DEPTH and _deeper_than(body, MAX_BODY_DEPTH):
        raise BadRequest(f"the body is nested more than {MAX_BODY_DEPTH} levels deep")
    for name, kind, described in _TYPED_FIELDS:
        value = body.get(name)
        if value is not None and not isinstance(value, kind):
            raise BadRequest(f"`{name}` must be {described}")
    return body


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` deep (without recursion)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def bad_request(exc: BadRequest, close: bool = False) -> Reply:
    return openai_error(400, str(exc), "BadRequestError", close)


USAGE_OPTIONS = b'"stream_options":{"include_usage":true,"continuous_usage_stats":false},'


def usage_injection(raw: bytes, body: dict[str, Any], engine_default: bool) -> bytes | None:
    """The body to send upstream when a stream needs its final usage chunk (usage, vLLM's
    per-request metrics) and the engine would not send it; None when nothing changes.

    `engine_default` is what the engine assumes for an absent `stream_options.include_usage`
    (vLLM: false, TensorRT-LLM: true); without `stream_options` neither sends usage.
    continuous_usage_stats is turned off with the injection: both engines honour it only
    together with include_usage, so without the gateway the client would have seen no usage
    on any chunk, and the gateway strips only the final usage chunk. The usual case (no
    `stream_options`) splices the option in rather than re-encoding what may be a long
    prompt."""
    if body.get("stream") is not True:
        return None
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage", engine_default) is True:
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
