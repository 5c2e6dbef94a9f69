"""The status last written per object, fresher than a lagging watch: a watch event that lags
behind the operator's own write would otherwise take the status backwards (a concluded
experiment back to Running)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

Body = dict[str, Any]
Key = tuple[str, str]
"""(namespace, name)."""
StatusT = TypeVar("StatusT")


def uid_of(body: Body) -> str | None:
    uid: str | None = body.get("metadata", {}).get("uid")
    return uid


class LastWritten(Generic[StatusT]):
    """Remembered with the object's uid: an object deleted and created again under the same
    name (its DELETED event missed) never builds on the old one's status."""

    def __init__(self) -> None:
        self._written: dict[Key, tuple[str | None, StatusT]] = {}

    def get(self, key: Key, body: Body) -> StatusT | None:
        """The status last written for this very object, if any."""
        uid, status = self._written.get(key, (None, None))
        return status if status is not None and uid == uid_of(body) else None

    def remember(self, key: Key, body: Body, status: StatusT) -> None:
        self._written[key] = (uid_of(body), status)

    def forget(self, key: Key) -> None:
        self._written.pop(key, None)
