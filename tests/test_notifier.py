"""A value that only its owner writes, announced by a Notifier: wait_until sleeps until the
announcement instead of polling, on asyncio and on trio, woken from the loop or from a thread."""

from __future__ import annotations

import anyio
import pytest

from aio_runtime import MemoryWatcher, Notifier, SignalTimeout, now, wait_until
from aio_runtime.testing import virtual_time

pytestmark = pytest.mark.anyio


class Value:
    """A value its owner writes and announces; every read is counted."""

    def __init__(self) -> None:
        self.value = 0
        self.reads = 0
        self.notifier = Notifier()

    def read(self) -> int:
        self.reads += 1
        return self.value

    def write(self, value: int) -> None:
        self.value = value  # stored first, then announced
        self.notifier.notify()


async def test_a_wait_with_a_notifier_sleeps_until_the_announcement():
    shared = Value()

    async def owner() -> None:
        await anyio.sleep(100.0)
        shared.write(5)

    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(owner)
        start = now()
        value = await wait_until(
            shared.read,
            lambda v: v == 5,
            awaited="the value",
            error=SignalTimeout,
            timeout=1000.0,
            notifier=shared.notifier,
        )
        assert now() - start == pytest.approx(100.0)
    assert (value, shared.reads) == (5, 2)


async def test_an_announcement_that_does_not_satisfy_the_wait_costs_one_read():
    shared = Value()

    async def owner() -> None:
        for value in (1, 2, 3):
            await anyio.sleep(1.0)
            shared.write(value)

    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(owner)
        with pytest.raises(SignalTimeout) as info:
            await wait_until(
                shared.read,
                lambda v: v == 9,
                awaited="the value",
                error=SignalTimeout,
                timeout=10.0,
                expected=9,
                notifier=shared.notifier,
            )
    assert shared.reads == 1 + 3 + 1  # the first read, one per announcement, one at the bound
    assert (info.value.expected, info.value.observed) == (9, 3)


async def test_a_wait_that_ends_stops_listening():
    shared = Value()
    async with virtual_time():
        with anyio.move_on_after(1.0):  # cancelled from outside
            await wait_until(
                shared.read,
                bool,
                awaited="the value",
                error=SignalTimeout,
                timeout=10.0,
                notifier=shared.notifier,
            )
    assert not shared.notifier._listeners
    shared.write(1)  # nobody is woken, nothing fails
    assert shared.reads == 1


async def test_a_notifier_and_a_watcher_are_refused_together():
    shared = Value()
    with MemoryWatcher("domain") as watcher, pytest.raises(TypeError, match="one or the other"):
        await wait_until(
            shared.read,
            bool,
            awaited="the value",
            error=SignalTimeout,
            timeout=1.0,
            notifier=shared.notifier,
            watcher=watcher,
        )
