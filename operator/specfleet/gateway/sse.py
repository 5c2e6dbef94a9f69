"""Server-sent events, as the engines write them: `data: <json>` events ended by a blank line.
Pure and byte-exact: joining the events a splitter returns (plus `rest`) gives back its input."""

from __future__ import annotations

DONE = b"[DONE]"


class SseSplitter:
    """Cuts a byte stream into whole events, keeping an unfinished tail for the next feed."""

    def __init__(self) -> None:
        self._tail = b""
        self._separator: bytes | None = None

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._tail + data if self._tail else data
        if self._separator is None:
            if b"\n" not in buffer:
                self._tail = buffer
                return []
            self._separator = b"\r\n\r\n" if b"\r\n" in buffer else b"\n\n"
        separator = self._separator
        events: list[bytes] = []
        start = 0
        while (end := buffer.find(separator, start)) >= 0:
            end += len(separator)
            events.append(buffer[start:end])
            start = end
        self._tail = buffer[start:]
        return events

    def ends_whole(self, data: bytes) -> bool:
        """Whether `data` is whole events: feeding it would leave nothing over."""
        separator = self._separator
        return not self._tail and separator is not None and data.endswith(separator)

    @property
    def separator(self) -> bytes | None:
        """What ends an event in this stream (known from its first line end)."""
        return self._separator

    @property
    def rest(self) -> bytes:
        """Bytes after the last complete event (relayed as they are when the stream ends)."""
        return self._tail


def data_payload(event: bytes) -> bytes | None:
    """The payload of a single-line `data:` event; None for comments, other fields and
    multi-line data (relayed untouched, never parsed)."""
    if not event.startswith(b"data:"):
        return None
    payload = event[5:].strip()
    if b"\n" in payload:
        return None
    return payload
