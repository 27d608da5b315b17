from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aio_runtime import (
    BudgetExhausted,
    Completion,
    Ledger,
    LedgerKind,
    RollbackFailed,
    SignalTimeout,
    Stages,
    deadline_scope,
    use_ledger,
    wait_complete,
)
from aio_runtime.testing import virtual_time

pytestmark = pytest.mark.anyio


class Acquired:
    def __init__(self):
        self.log: list[str] = []

    def take(self, name: str):
        self.log.append(f"+{name}")
        return name

    def give(self, name: str):
        self.log.append(f"-{name}")


async def test_a_failed_stage_releases_earlier_stages_in_reverse_and_reraises():
    res = Acquired()
    ledger = Ledger()
    with pytest.raises(KeyError, match="map failed"):
        async with Stages("buffer", ledger=ledger) as stages:
            await stages.acquire(lambda: res.take("va"), res.give, label="va")
            await stages.acquire(lambda: res.take("vram"), res.give, label="vram")
            raise KeyError("map failed")
    assert res.log == ["+va", "+vram", "-vram", "-va"]
    ledger.assert_empty()


async def test_every_release_is_attempted_and_every_failure_reported():
    res = Acquired()

    def failing_release(name: str):
        res.log.append(f"!{name}")
        raise OSError(f"cannot release {name}")

    with pytest.raises(RollbackFailed) as info:
        async with Stages("buffer", ledger=Ledger()) as stages:
            await stages.acquire(lambda: res.take("a"), res.give, label="a")
            await stages.acquire(lambda: res.take("b"), failing_release, label="b")
            await stages.acquire(lambda: res.take("c"), failing_release, label="c")
            raise ValueError("d failed")
    assert res.log == ["+a", "+b", "+c", "!c", "!b", "-a"]
    group = info.value
    assert isinstance(group.exceptions[0], ValueError)
    assert [str(e) for e in group.exceptions[1:]] == ["cannot release c", "cannot release b"]


async def test_async_acquire_and_release_are_awaited():
    res = Acquired()

    async def take():
        await anyio.lowlevel.checkpoint()
        return res.take("ring")

    async def give(name):
        await anyio.lowlevel.checkpoint()
        res.give(name)

    with pytest.raises(RuntimeError):
        async with Stages("ring", ledger=Ledger()) as stages:
            assert await stages.acquire(take, give, label="ring") == "ring"
            raise RuntimeError("boom")
    assert res.log == ["+ring", "-ring"]


async def test_committed_stages_belong_to_the_caller_until_released():
    res = Acquired()
    ledger = Ledger()
    async with Stages("buffer", ledger=ledger) as stages:
        await stages.acquire(lambda: res.take("va"), res.give, label="va")
        await stages.acquire(lambda: res.take("map"), res.give, label="map")
        owned = stages.commit()
    assert res.log == ["+va", "+map"]
    assert len(ledger.live()) == 2
    await owned.release()
    await owned.release()  # idempotent
    assert res.log == ["+va", "+map", "-map", "-va"]
    assert owned.released
    ledger.assert_empty()


async def test_a_block_without_commit_releases_its_stages():
    res = Acquired()
    async with Stages("scratch", ledger=Ledger()) as stages:
        await stages.acquire(lambda: res.take("tmp"), res.give, label="tmp")
    assert res.log == ["+tmp", "-tmp"]


async def test_stages_cannot_be_used_after_commit():
    async with Stages("x", ledger=Ledger()) as stages:
        stages.commit()
        with pytest.raises(RuntimeError, match="committed"):
            stages.add(lambda: None, label="late")


async def test_a_hung_release_is_bounded_and_the_others_still_run():
    res = Acquired()

    async def hang(name):
        await anyio.Event().wait()

    async with virtual_time():
        with pytest.raises(RollbackFailed) as info:
            async with Stages("buffer", cleanup_timeout=2.0, ledger=Ledger()) as stages:
                await stages.acquire(lambda: res.take("a"), res.give, label="a")
                await stages.acquire(lambda: res.take("b"), hang, label="b")
                raise OSError("c failed")
    assert res.log == ["+a", "+b", "-a"]
    assert "took over 2.0 s" in str(info.value.exceptions[1])


async def test_rollback_runs_after_the_frame_budget_is_spent():
    released = []

    async def release_with_device_wait(name):
        # a release that itself waits on hardware: it gets its own bound, not the spent budget
        completion: Completion[None] = Completion()
        completion.set_result(None)
        await wait_complete(completion, awaited="unmap", error=SignalTimeout, timeout=1.0)
        released.append(name)

    async with virtual_time():
        with deadline_scope(0.05, name="frame 4"):
            with pytest.raises(BudgetExhausted):
                async with Stages("frame buffers", ledger=Ledger()) as stages:
                    await stages.acquire(lambda: "in", release_with_device_wait, label="in")
                    await wait_complete(Completion(), awaited="kernel", error=SignalTimeout)
    assert released == ["in"]


async def test_rollback_completes_when_the_owner_is_cancelled():
    res = Acquired()

    async def slow_give(name):
        await anyio.sleep(0.5)
        res.give(name)

    async with virtual_time():
        with anyio.move_on_after(1.0):
            async with Stages("buffer", ledger=Ledger()) as stages:
                await stages.acquire(lambda: res.take("a"), slow_give, label="a")
                await anyio.sleep(10)
    assert res.log == ["+a", "-a"]


def test_a_ledger_kind_is_the_string_it_names():
    ledger = Ledger()
    by_member = ledger.open(LedgerKind.USB_TRANSFER, "bulk out 0x02")
    by_string = ledger.open("usb transfer", "bulk in 0x81")
    assert by_member.kind == by_string.kind == LedgerKind.USB_TRANSFER == "usb transfer"
    assert str(by_member) == "usb transfer: bulk out 0x02"


async def test_stages_are_recorded_as_stage_entries():
    ledger = Ledger()
    async with Stages("buffer", ledger=ledger) as stages:
        stages.add(lambda: None, label="va")
        assert [(e.kind, e.description) for e in ledger.live()] == [(LedgerKind.STAGE, "buffer/va")]
    ledger.assert_empty()


async def test_use_ledger_scopes_where_resources_are_recorded():
    ledger = Ledger()
    with use_ledger(ledger):
        stages = Stages("scoped")
    stages.add(lambda: None, label="x")
    assert len(ledger.live()) == 1
    async with stages:
        pass
    ledger.assert_empty()


@settings(max_examples=60, deadline=None)
@given(
    n_stages=st.integers(0, 8),
    fail_at=st.integers(0, 9),
    failing_releases=st.sets(st.integers(0, 8)),
)
def test_rollback_releases_exactly_what_was_acquired(n_stages, fail_at, failing_releases):
    acquired: list[int] = []
    released: list[int] = []
    ledger = Ledger()

    def acquire(i: int):
        if i == fail_at:
            raise LookupError(f"stage {i} failed")
        acquired.append(i)
        return i

    def release(i: int):
        released.append(i)
        if i in failing_releases:
            raise OSError(f"release {i} failed")

    async def scenario():
        async with Stages("prop", ledger=ledger) as stages:
            for i in range(n_stages):
                await stages.acquire(lambda i=i: acquire(i), release, label=str(i))

    try:
        anyio.run(scenario)
    except (LookupError, RollbackFailed):
        pass
    assert released == acquired[::-1]
    # a release that failed is a leak, and the ledger keeps saying so
    leaked = sorted(int(e.description.split("/")[1].split()[0]) for e in ledger.live())
    assert leaked == sorted(set(acquired) & failing_releases)


async def test_a_failed_release_stays_in_the_ledger_as_a_leak():
    ledger = Ledger()

    async def hang(name):
        await anyio.Event().wait()

    async with virtual_time():
        with pytest.raises(RollbackFailed):
            async with Stages("buf", cleanup_timeout=1.0, ledger=ledger) as stages:
                await stages.acquire(lambda: "dma", hang, label="dma")
                await stages.acquire(lambda: "map", lambda _: None, label="map")
                raise OSError("bind failed")
    live = [str(e) for e in ledger.live()]
    assert len(live) == 1
    assert live[0].startswith("stage: buf/dma (release failed: releasing 'dma' of 'buf' took over")
    with pytest.raises(AssertionError, match="release failed"):
        ledger.assert_empty()


async def test_concurrent_releases_release_each_stage_once():
    released = []

    async def give(name):
        await anyio.sleep(0.01)
        released.append(name)

    ledger = Ledger()
    async with Stages("buf", ledger=ledger) as stages:
        await stages.acquire(lambda: "va", give, label="va")
        await stages.acquire(lambda: "pa", give, label="pa")
        owned = stages.commit()
    async with anyio.create_task_group() as tg:
        tg.start_soon(owned.release)
        tg.start_soon(owned.release)
    assert released == ["pa", "va"]
    ledger.assert_empty()


async def test_a_second_releaser_waits_for_the_first_and_shares_its_failure():
    async def slow_failing_release(name):
        await anyio.sleep(0.05)
        raise OSError("unmap failed")

    outcomes = []

    async def release(owned):
        try:
            await owned.release()
            outcomes.append("ok")
        except RollbackFailed:
            outcomes.append("failed")

    async with Stages("buf", ledger=Ledger()) as stages:
        await stages.acquire(lambda: "vram", slow_failing_release, label="vram")
        owned = stages.commit()
    async with anyio.create_task_group() as tg:
        tg.start_soon(release, owned)
        tg.start_soon(release, owned)
    assert outcomes == ["failed", "failed"]
    assert not owned.released


async def test_cleanup_timeout_must_be_finite():
    with pytest.raises(ValueError):
        Stages("x", cleanup_timeout=float("inf"))
