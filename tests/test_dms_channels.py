"""Latest-frame-wins slots and the frame accounting rule."""

from __future__ import annotations

import anyio
import pytest

from pipelines.dms.service.slots import FrameAccounting, HandoffSlot, LatestSlot, SlotClosed

pytestmark = pytest.mark.anyio


async def test_a_newer_item_replaces_a_waiting_one_and_the_old_one_is_counted():
    dropped: list[int] = []
    slot: LatestSlot[int] = LatestSlot("warp", dropped.append)
    slot.put(1)
    slot.put(2)
    slot.put(3)
    assert await slot.get() == 3
    assert dropped == [1, 2]


async def test_a_consumer_waits_for_an_item_and_ends_when_closed():
    slot: LatestSlot[int] = LatestSlot("model", lambda _: None)
    got: list[int] = []

    async def consumer():
        while True:
            try:
                got.append(await slot.get())
            except SlotClosed:
                return

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consumer)
            await anyio.sleep(0.01)
            slot.put(7)
            await anyio.sleep(0.01)
            slot.put(8)
            slot.close()
    assert got == [7, 8]
    with pytest.raises(SlotClosed):
        slot.put(9)


def test_accounting_balances_and_says_what_is_missing():
    frames = FrameAccounting()
    for _ in range(5):
        frames.receive()
    frames.published(True)
    frames.published(False, "calibration stale")
    frames.drop("warp")
    frames.check(in_flight=2)
    with pytest.raises(AssertionError, match="2 unaccounted, expected 0"):
        frames.check()
    assert frames.invalid["calibration stale"] == 1


async def test_a_handoff_returns_once_taken_and_says_when():
    taken_at: list[tuple[int, int]] = []
    slot: HandoffSlot[int] = HandoffSlot("warp", lambda item: taken_at.append((item, len(got))))
    got: list[int] = []
    sent: list[int] = []

    async def producer():
        for item in (1, 2, 3):
            await slot.send(item)
            sent.append(item)  # only once the consumer has it
        slot.close()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.wait_all_tasks_blocked()
            assert sent == []  # nothing taken yet: the producer waits with its first item
            while True:
                try:
                    got.append(await slot.get())
                except SlotClosed:
                    break
                await anyio.wait_all_tasks_blocked()
                assert sent == got  # each send returned once (and only once) its item was taken
    assert got == [1, 2, 3] and taken_at == [(1, 0), (2, 1), (3, 2)]


async def test_a_handoff_cancelled_before_it_is_taken_withdraws_its_item():
    slot: HandoffSlot[int] = HandoffSlot("model")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(slot.send, 1)
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()  # the producer stops before anyone took the item
    slot.close()
    with pytest.raises(SlotClosed):
        await slot.get()
