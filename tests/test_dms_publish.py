"""The driverStateV2 message, the in-process subscriptions, and sinks driven together."""

from __future__ import annotations

import base64
import gc
import json
import re
import threading

import anyio
import numpy as np
import pytest
from dms_messages import RUN_ID, message
from sink_checks import assert_exact

from aio_runtime.testing import virtual_time
from pipelines.dms.config.kinds import Mode
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.messages import READINESS_LAYERS, DriverStateV2, new_run_id
from pipelines.dms.sinks.base import LIVE_BACKLOG, SinkFailed, SubscriptionStalled, Waiters
from pipelines.dms.sinks.jsonl import JsonLinesSink
from pipelines.dms.sinks.memory import Subscriptions
from pipelines.dms.sinks.publish import Sinks

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def test_the_record_uses_openpilot_names_plus_ours():
    raw = np.arange(4, dtype="<f4").tobytes()
    record = message(raw=raw).to_record()
    assert record["frameId"] == 100 and record["seq"] == 0
    assert record["leftDriverData"]["faceOrientation"] == pytest.approx([0.1, 0.2, 0.3])
    assert record["rightDriverData"]["phoneProb"] == 0.5
    assert set(record["readiness"]) == set(READINESS_LAYERS)
    assert np.frombuffer(base64.b64decode(record["rawPredictions"]), "<f4").tolist() == [0, 1, 2, 3]
    assert "rawPredictions" not in message().to_record()  # only when enabled
    assert json.loads(message().to_json())["valid"] is True


def test_every_record_carries_its_run_id_after_its_sequence_number():
    record = message(seq=4).to_record()
    assert record["runId"] == RUN_ID
    assert list(record)[:2] == ["seq", "runId"]
    assert json.loads(message(valid=False).to_json())["runId"] == RUN_ID


def test_a_fresh_run_id_is_the_time_then_a_random_suffix_and_differs_each_time():
    first = new_run_id()
    ids = {first, *(new_run_id() for _ in range(99))}
    assert len(ids) == 100
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{8}", first), first
    assert ServiceConfig(run_id=first).run_id == first  # a fresh id is one a user may give


def test_an_invalid_message_says_why_and_carries_no_driver_data():
    record = message(valid=False).to_record()
    assert record["valid"] is False and record["leftDriverData"] is None
    assert record["reason"].startswith("gpu-queue")


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"availability": "fine"}, "availability"),
        ({"readiness": {"deviceOnline": True}}, "readiness lacks"),
        ({"left_driver_data": {"faceProb": 1.0}}, "exactly the fields"),
        ({"left_driver_data": None}, "valid message carries driver data"),
        ({"run_id": ""}, "run_id must be a non-empty string"),
        ({"run_id": None}, "run_id must be a non-empty string"),
    ],
)
def test_malformed_messages_are_refused_with_what_was_expected(change, complaint):
    fields = {**message().__dict__, **change}
    with pytest.raises(ValueError, match=complaint):
        DriverStateV2(**fields)


async def read_all(subscription, into):
    async for m in subscription:
        into.append(m.seq)


# -- in-process subscriptions, live ------------------------------------------------------------


async def test_subscribers_get_every_message_in_order_and_a_slow_one_loses_the_oldest():
    subscriptions = Subscriptions()
    everything, fast = subscriptions.subscribe(), []
    slow_one, slow = subscriptions.subscribe(backlog=2), []
    with anyio.fail_after(5):
        for seq in range(5):
            subscriptions.publish(message(seq))
        subscriptions.close()
        await read_all(everything, fast)
        await read_all(slow_one, slow)
    assert fast == [0, 1, 2, 3, 4]
    assert slow == [3, 4]  # a backlog of 2: the oldest went (the gap shows in seq)
    assert slow_one.stats().dropped == 3 and slow_one.stats().delivered == 2
    total = subscriptions.stats()
    assert (total.published, total.delivered, total.dropped) == (10, 7, 3)
    assert_exact(total)


async def test_a_live_subscriber_holds_200_then_drops_the_oldest_logged_when_it_starts_and_stops(
    captured_logs,
):
    subscriptions = Subscriptions()
    subscription = subscriptions.subscribe()
    for seq in range(LIVE_BACKLOG + 50):
        subscriptions.publish(message(seq))
    assert subscription.stats().dropped == 50 and subscription.stats().pending == LIVE_BACKLOG
    started = [e for e in captured_logs if e["event"] == "sink dropping messages"]
    assert len(started) == 1 and started[0]["log_level"] == "warning"
    assert started[0]["sink"] == subscription.name
    with anyio.fail_after(5):
        first = [(await anext(subscription)).seq for _ in range(LIVE_BACKLOG)]
    assert first == list(range(50, LIVE_BACKLOG + 50))  # the newest 200
    subscriptions.publish(message(LIVE_BACKLOG + 50))  # room again: the episode ends
    [stopped] = [e for e in captured_logs if e["event"] == "sink stopped dropping"]
    assert stopped["dropped"] == 50 and stopped["log_level"] == "warning"


async def test_a_subscriber_that_stops_iterating_loses_what_it_held_counted_exactly():
    subscriptions = Subscriptions(backlog=50)
    subscription, seen = subscriptions.subscribe(), []
    async with virtual_time():
        for seq in range(300):
            subscriptions.publish(message(seq))
            if seq < 10:
                seen.append((await anext(subscription)).seq)  # then it stops reading
        stats = await subscriptions.aclose(timeout=5)  # nobody drains: 5 virtual seconds
    assert seen == list(range(10))
    assert (stats.published, stats.delivered, stats.dropped) == (300, 10, 290)
    assert_exact(stats)
    with anyio.fail_after(1):
        assert [m async for m in subscription] == []  # closed: it ends


async def test_a_subscriber_let_go_leaves_and_what_it_held_counts_as_dropped():
    subscriptions = Subscriptions()
    subscription = subscriptions.subscribe()
    subscriptions.publish(message(0))
    del subscription
    gc.collect()
    subscriptions.publish(message(1))  # to nobody
    stats = subscriptions.stats()
    assert (stats.published, stats.delivered, stats.dropped, stats.pending) == (1, 0, 1, 0)


async def test_a_subscription_made_after_close_ends_at_once_and_aclose_leaves():
    subscriptions = Subscriptions()
    leaving = subscriptions.subscribe()
    subscriptions.publish(message(0))
    await leaving.aclose()
    assert leaving.stats().dropped == 1
    subscriptions.close()
    with anyio.fail_after(1):
        assert [m async for m in subscriptions.subscribe()] == []
        assert [m async for m in leaving] == []


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ({"backlog": 0}, "backlog must be"),
        ({"backlog": 2.5}, "backlog must be"),
        ({"stall_limit": 0}, "stall_limit must be"),
        ({"stall_limit": float("nan")}, "stall_limit must be"),
        ({"stall_limit": float("inf")}, "stall_limit must be"),
        ({"stall_limit": True}, "stall_limit must be"),
        ({"backlog": True}, "backlog must be"),
    ],
)
def test_subscriptions_refuse_bounds_that_bound_nothing(arguments, complaint):
    with pytest.raises(ValueError, match=complaint):
        Subscriptions(**arguments)


# -- in-process subscriptions, replay ----------------------------------------------------------


async def test_a_replay_waits_for_a_subscriber_stalled_5_s_and_it_gets_every_message():
    subscriptions = Subscriptions(delivery=Mode.REPLAY, backlog=20)
    subscription, got = subscriptions.subscribe(), []
    held: dict[str, float] = {}

    async def reader():
        await anyio.sleep(5)  # stalled
        held["published"] = subscriptions.stats().published
        await read_all(subscription, got)

    async def producer():
        start = anyio.current_time()
        for seq in range(1000):
            await subscriptions.room()
            subscriptions.publish(message(seq))
        held["took"] = anyio.current_time() - start
        await subscriptions.aclose()

    async with virtual_time():
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(reader)
                tg.start_soon(producer)
    assert got == list(range(1000))
    assert held["published"] == 20  # the backlog: the producer waited there
    assert held["took"] >= 5
    stats = subscriptions.stats()
    assert stats.dropped == 0 and stats.delivered == 1000
    assert_exact(stats)


async def test_a_subscriber_holding_a_replay_past_its_stall_limit_is_closed_and_counted(
    captured_logs,
):
    subscriptions = Subscriptions(delivery=Mode.REPLAY, backlog=10, stall_limit=3)
    healthy, stalled = subscriptions.subscribe(), subscriptions.subscribe()
    got, late = [], []
    resume = anyio.Event()
    when: dict[str, float] = {}

    async def stalls():
        for _ in range(5):
            late.append((await anext(stalled)).seq)
        await resume.wait()  # stops reading until the replay is over
        with pytest.raises(SubscriptionStalled, match="3 s without reading"):
            await read_all(stalled, late)

    async def producer():
        start = anyio.current_time()
        for seq in range(100):
            await subscriptions.room()
            subscriptions.publish(message(seq))
        when["took"] = anyio.current_time() - start
        subscriptions.close()
        resume.set()

    async with virtual_time():
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_all, healthy, got)
                tg.start_soon(stalls)
                tg.start_soon(producer)
    assert got == list(range(100))  # the replay went on for the healthy one
    assert late == list(range(15))  # 5 read, then the 10 it held when it was closed
    assert 3 <= when["took"] < 4
    stats = stalled.stats()
    assert (stats.published, stats.delivered, stats.dropped) == (100, 15, 85)
    assert_exact(stats)
    assert_exact(subscriptions.stats())
    [closed] = [e for e in captured_logs if e["event"].startswith("subscription closed")]
    assert closed["subscription"] == stalled.name


# -- sinks together ----------------------------------------------------------------------------


async def test_sinks_together_wait_for_the_slowest_and_report_each():
    quick = Subscriptions(delivery=Mode.REPLAY, backlog=5, name="quick")
    slow = Subscriptions(delivery=Mode.REPLAY, backlog=5, name="slow")
    sinks = Sinks([quick, slow])
    readers = [quick.subscribe(), slow.subscribe()]
    got: list[list[int]] = [[], []]

    async def read(index, pause):
        async for m in readers[index]:
            got[index].append(m.seq)
            await anyio.sleep(pause)

    async with virtual_time():
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read, 0, 0.01)
                tg.start_soon(read, 1, 1.0)
                for seq in range(30):
                    await sinks.room()
                    sinks.publish(message(seq))
                stats = await sinks.aclose(timeout=60)
    assert got == [list(range(30)), list(range(30))]
    assert [s.name for s in stats] == ["quick", "slow"]
    for s in stats:
        assert (s.published, s.delivered, s.dropped) == (30, 30, 0)


async def test_sinks_together_say_which_one_failed_as_soon_as_it_does():
    sinks = Sinks([Subscriptions(), JsonLinesSink("/dev/full")])
    sinks.publish(message(0))
    with anyio.fail_after(10):
        failure = await sinks.wait_failure()
        assert await sinks.wait_failure() is failure  # asked again: the same one, at once
    assert isinstance(failure, SinkFailed) and failure.sink == "jsonl /dev/full"
    stats = await sinks.aclose(timeout=1)
    assert stats[1].failed == str(failure)
    for s in stats:
        assert_exact(s)


async def test_waiters_return_once_the_state_holds_changed_and_woken_from_another_thread():
    lock, waiters = threading.Lock(), Waiters()
    state = {"ready": False}
    seen: list[bool] = []

    def change() -> None:
        with lock:  # waits for the check under way to register its waiter
            state["ready"] = True
        waiters.wake()

    def ready() -> bool:
        seen.append(state["ready"])
        if len(seen) == 1:
            threading.Thread(target=change).start()
        return state["ready"]

    with anyio.fail_after(5):
        await waiters.until(lock, ready)
        assert seen == [False, True]  # checked, woken, checked again
        await waiters.until(lock, ready)  # holds already: returns at once
    assert seen == [False, True, True]
