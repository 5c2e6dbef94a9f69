"""The engine's batch as the gateway sees it. The gateway is its engine's only client, so the
inference requests in flight through it are the engine's batch (give or take a request whose
last bytes are still on their way to the client). TensorRT-LLM drafts by batch size, so each
request keeps the smallest and largest batch it saw."""

from __future__ import annotations


class BatchSpan:
    """The smallest and largest number of requests in flight while one request was."""

    __slots__ = ("largest", "smallest")

    def __init__(self, size: int) -> None:
        self.smallest = self.largest = size

    def see(self, size: int) -> None:
        self.smallest = min(self.smallest, size)
        self.largest = max(self.largest, size)


class InFlight:
    """Inference requests in flight. Each arrival and departure is seen by every request in
    flight: cost proportional to the batch, which the engine bounds."""

    def __init__(self) -> None:
        self._open: set[BatchSpan] = set()

    def __len__(self) -> int:
        return len(self._open)

    def enter(self) -> BatchSpan:
        span = BatchSpan(len(self._open) + 1)
        self._open.add(span)
        self._seen()
        return span

    def leave(self, span: BatchSpan) -> None:
        self._open.discard(span)
        self._seen()

    def _seen(self) -> None:
        size = len(self._open)
        for span in self._open:
            span.see(size)
