"""Whether a pool that failed to connect is worth another attempt yet (issue 29).

After a failed attempt the pool is not tried for a back-off that starts at `first` seconds and
doubles per consecutive failure up to `cap`; then one request at a time probes it, and a
success ends the back-off. Pure: the clock (monotonic seconds) is passed in.
"""

from __future__ import annotations

from collections.abc import Callable


class Backoff:
    def __init__(self, clock: Callable[[], float], first: float = 1.0, cap: float = 30.0) -> None:
        self.clock = clock
        self.first, self.cap = first, cap
        self.delay = 0.0
        """The current back-off; 0 while the pool is available."""
        self._retry_at = 0.0
        self._probing = False
        self._state = 0
        """Moves on each change of availability: an attempt admitted before one is stale."""

    @property
    def available(self) -> bool:
        return not self.delay

    def admit(self) -> int | None:
        """The attempt's ticket, for its outcome; None: do not try the pool now."""
        if self.delay:
            if self._probing or self.clock() < self._retry_at:
                return None
            self._probing = True
        return self._state

    def failed(self, attempt: int) -> bool:
        """An attempt failed; True when that made the pool unavailable. Attempts admitted before
        the pool was known down (in flight together when it went) fail once for all."""
        if attempt != self._state:
            return False
        became = self.available
        self.delay = self.first if became else min(self.cap, self.delay * 2)
        self._retry_at = self.clock() + self.delay
        self._probing = False
        self._state += 1
        return became

    def succeeded(self) -> bool:
        """An attempt connected; True when that made the pool available again."""
        if self.available:
            return False
        self.delay = 0.0
        self._probing = False
        self._state += 1
        return True

    def abandoned(self, attempt: int) -> None:
        """An attempt ended without an outcome (its request was cancelled): another may probe."""
        if attempt == self._state:
            self._probing = False
