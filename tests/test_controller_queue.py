"""The reconcile work queue: dedup, one worker per key, and a key named while in progress."""

from __future__ import annotations

import asyncio

from specfleet.controller.queue import WorkQueue

A, B = ("ns", "a"), ("ns", "b")


def test_a_key_named_many_times_waits_once() -> None:
    async def scenario() -> list[tuple[str, str]]:
        queue = WorkQueue()
        for key in (A, B, A, A, B):
            queue.add(key)
        assert len(queue) == 2
        return [await queue.get(), await queue.get()]

    assert asyncio.run(scenario()) == [A, B]


def test_a_key_named_while_in_progress_goes_again_only_after_it_is_done() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        queue.add(A)
        assert await queue.get() == A
        queue.add(A)  # an event while a worker reconciles A
        queue.add(B)
        assert await queue.get() == B  # A is not handed to a second worker
        queue.done(A)
        assert await asyncio.wait_for(queue.get(), 1) == A

    asyncio.run(scenario())


def test_a_key_done_without_new_events_is_not_queued_again() -> None:
    async def scenario() -> None:
        queue = WorkQueue()
        queue.add(A)
        await queue.get()
        queue.done(A)
        assert len(queue) == 0
        try:
            await asyncio.wait_for(queue.get(), 0.05)
        except TimeoutError:
            return
        raise AssertionError("A came back without an event")

    asyncio.run(scenario())


def test_add_after_queues_the_key_once_the_delay_has_passed() -> None:
    async def scenario() -> float:
        queue = WorkQueue()
        loop = asyncio.get_running_loop()
        start = loop.time()
        queue.add_after(A, 0.1)
        assert len(queue) == 0
        assert await asyncio.wait_for(queue.get(), 1) == A
        return loop.time() - start

    assert asyncio.run(scenario()) >= 0.1
