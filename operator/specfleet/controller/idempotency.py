"""Idempotency keys for the operator's decisions: what tells a repeated attempt to tell of one
(a new leader's, a restarted operator's) from a new decision.

A decision in status is (time, action, reason, message) on one object (its uid); its key is a
hash of those, so it is recorded in status with the decision itself. Its Event is named after
the key: posting it twice is the API server's 409, and a replica that starts acting can post
the Events of recent decisions that its predecessor wrote to status but did not live to tell
(`untold`), finding by name those it did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import datetime, timedelta

from specfleet.api.status import Decision

KEY_LENGTH = 16
REPOST_WINDOW = timedelta(minutes=10)
"""How far back a replica that starts acting looks for decisions whose Events may be missing."""


def decision_key(uid: str | None, time: str, action: str, reason: str, message: str) -> str:
    text = "\0".join((uid or "", time, action, reason, message))
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def key_of(uid: str | None, decision: Decision) -> str:
    return decision_key(uid, decision.time, decision.action, decision.reason, decision.message)


def event_name(involved: str, key: str) -> str:
    """An Event's name is a DNS subdomain (at most 253 characters)."""
    return f"{involved[: 252 - KEY_LENGTH]}.{key}"


def untold(decisions: Iterable[Decision], now: datetime) -> list[Decision]:
    """The decisions recent enough that their Events may still be wanted."""
    return [d for d in decisions if now - datetime.fromisoformat(d.time) <= REPOST_WINDOW]
