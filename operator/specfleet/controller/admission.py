"""The admission webhook: the API server asks the operator whether a SpecModel may be stored and
gets every error `parse_specmodel` finds, the ones CEL cannot express (the escape hatches'
flags and keys) among them. Registered only when `specfleet run` serves a webhook: kopf refuses
to start with an admission handler and no server for it."""

from __future__ import annotations

from typing import Any

import kopf

from specfleet.api import GROUP, PLURAL, VERSION, InvalidSpecModel, parse_specmodel

HANDLER_ID = "specmodels"
"""The webhook's path on the operator's server: `/specmodels`."""
_registered = False


def admit(body: kopf.Body, **_: Any) -> None:
    try:
        parse_specmodel(dict(body))
    except InvalidSpecModel as exc:
        raise kopf.AdmissionError("\n".join(str(e) for e in exc.errors), code=422) from None


def register() -> None:
    """Adds the webhook's handler to kopf's registry, once per process."""
    global _registered
    if not _registered:
        kopf.on.validate(GROUP, VERSION, PLURAL, id=HANDLER_ID, operations=["CREATE", "UPDATE"])(
            admit
        )
        _registered = True


def server(address: str, port: int, certfile: str, keyfile: str) -> kopf.WebhookServer:
    """HTTPS on `address:port` with the given certificate; the chart (or the test) owns the
    ValidatingWebhookConfiguration and its CA bundle."""
    return kopf.WebhookServer(addr=address, port=port, certfile=certfile, pkeyfile=keyfile)
