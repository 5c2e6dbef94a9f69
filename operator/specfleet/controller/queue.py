"""The work queue of SpecModels to reconcile, with client-go's workqueue semantics: a key waits
at most once however many events name it meanwhile, and no two workers reconcile the same key
at once (a key named again while it is being reconciled goes again once that is done).

Event handlers only add keys, so kopf's per-object workers finish at once and the watch events'
bodies are not held while reconciles wait for a thread. Event-loop only: no locks.
"""

from __future__ import annotations

import asyncio

Key = tuple[str, str]
"""(namespace, SpecModel name)."""


class WorkQueue:
    def __init__(self) -> None:
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._dirty: set[Key] = set()
        self._processing: set[Key] = set()

    def add(self, key: Key) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._ready.put_nowait(key)

    def add_after(self, key: Key, seconds: float) -> None:
        asyncio.get_running_loop().call_later(seconds, self.add, key)

    async def get(self) -> Key:
        key = await self._ready.get()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: Key) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._ready.put_nowait(key)

    def __len__(self) -> int:
        return len(self._dirty)
