"""The copy protocol through the in-process simulator: integrity, protocol behaviour, faults."""

from __future__ import annotations

import os

import anyio
import pytest
from gpu_sim import FAST, SLACK, session
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aio_runtime import Layer, Ledger, SignalTimeout, UsbTransferTimeout, now, use_ledger
from aio_runtime.testing import virtual_time
from transports.errors import GpuFault
from transports.gpu.copy import CHUNK, HALF, sentinel
from transports.sim import Fault, FaultRule

pytestmark = pytest.mark.anyio

SIZES = [0, 1, 511, 512, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7, 8 << 20]


async def round_trip(gpu, data: bytes) -> bytes:
    buffer = await gpu.alloc(max(1, len(data)))
    try:
        await gpu.copy_in(buffer, data)
        return bytes(await gpu.copy_out(buffer, len(data)))
    finally:
        await gpu.free(buffer)


@pytest.mark.parametrize("size", SIZES)
async def test_copies_round_trip_byte_exact(size):
    data = os.urandom(size)
    async with session() as (_, gpu):
        assert await round_trip(gpu, data) == data


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=3 * CHUNK) | st.sampled_from(SIZES[:-1]).map(os.urandom))
async def test_random_data_round_trips(data):
    async with session() as (_, gpu):
        assert await round_trip(gpu, data) == data


async def test_two_chunks_are_in_flight_and_a_half_is_reused_only_once_drained():
    async with session() as (sim, gpu):
        buffer = await gpu.alloc(4 * CHUNK)
        sim.bridge.requests.clear()
        await gpu.copy_in(buffer, os.urandom(4 * CHUNK))
        log = [
            ("arm" if r == 0xF2 else "fence" if r == 0xE4 else "data")
            for kind, r, _, _ in sim.bridge.requests
            if r in (0xF2, 0xE4) or kind == "bulk_out"
        ]
        log = log[log.index("arm") :]  # after the program was written
        # chunks 0 and 1 go out back to back; chunk 2 waits for the fence of chunk 0
        assert log[:5] == ["arm", "data", "arm", "data", "fence"]
        assert log.count("data") == 4


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio orders the engine's passes apart
async def test_a_fence_read_finds_the_engine_caught_up():
    """The host yields before it reads the fence, so the in-process copy engine has consumed
    what was sent: 6 chunks need 3 fence reads (before chunk 2, before chunk 4, at the end)."""
    async with session() as (sim, gpu):
        buffer = await gpu.alloc(6 * CHUNK)
        sim.bridge.requests.clear()
        await gpu.copy_in(buffer, os.urandom(6 * CHUNK))
        reads = [r for kind, r, _, _ in sim.bridge.requests if r == 0xE4]
        assert len(reads) == 3


async def test_a_stale_sentinel_from_an_earlier_batch_is_never_taken_for_a_new_chunk():
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(2 * CHUNK)
        # The engine never sees chunk 0's sentinel: the batch fails with sentinel(0) left in SRAM.
        sim.plan.add(FaultRule(Fault.SENTINEL_NEVER_CONSUMED, at=1))
        with pytest.raises(SignalTimeout):
            await gpu.copy_in(buffer, b"\x11" * (2 * CHUNK))
        assert int.from_bytes(sim.bridge.sram[HALF - 4 : HALF], "little") == sentinel(0)
        fresh = os.urandom(2 * CHUNK)
        await gpu.recover()
        assert int.from_bytes(sim.bridge.sram[HALF - 4 : HALF], "little") == 0
        await gpu.copy_in(buffer, fresh)
        assert bytes(await gpu.copy_out(buffer)) == fresh


async def test_an_armed_copy_out_read_waits_for_the_gpu_release():
    async with session() as (sim, gpu):
        buffer = await gpu.alloc(1024)
        await gpu.copy_in(buffer, b"\x42" * 1024)
        sim.bridge.requests.clear()
        assert bytes(await gpu.copy_out(buffer)) == b"\x42" * 1024
        kinds = [(k, r) for k, r, _, _ in sim.bridge.requests]
        arm = kinds.index(("control_out", 0xF2))
        assert kinds[arm + 1] == ("control_out", 0xF0)  # usb_go, then the bulk IN
        assert kinds[arm + 2][0] == "bulk_in"


FAULTS = [
    # fault, operation, error type, layer, bound that fires
    (Fault.SENTINEL_NEVER_CONSUMED, "in", SignalTimeout, Layer.GPU_QUEUE, FAST.fence_timeout),
    (Fault.CORRUPT_SENTINEL, "in", SignalTimeout, Layer.GPU_QUEUE, FAST.fence_timeout),
    (Fault.USB_COMPLETION_LOST, "in", UsbTransferTimeout, Layer.USB_TRANSFER, FAST.bulk_timeout),
    (Fault.COPYOUT_RELEASE_NEVER, "out", UsbTransferTimeout, Layer.USB_TRANSFER, FAST.bulk_timeout),
    (Fault.COPY_WATCHDOG, "in", GpuFault, Layer.GPU_QUEUE, FAST.fence_timeout),
    (Fault.USB_TIMEOUT, "in", UsbTransferTimeout, Layer.USB_TRANSFER, FAST.bulk_timeout),
]


@pytest.mark.parametrize(("fault", "direction", "error", "layer", "bound"), FAULTS)
async def test_copy_faults_are_typed_bounded_leave_nothing_behind_and_recover(
    fault, direction, error, layer, bound
):
    data = os.urandom(3 * CHUNK)
    ledger = Ledger()
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(len(data))
        await gpu.copy_in(buffer, data)
        with use_ledger(ledger):
            sim.plan.add(FaultRule(fault, at=2 if fault is Fault.USB_TIMEOUT else 1))
            start = now()
            with pytest.raises(error) as info:
                if direction == "in":
                    await gpu.copy_in(buffer, data)
                else:
                    await gpu.copy_out(buffer)
            elapsed = now() - start
        exc = info.value
        assert exc.layer is layer
        assert elapsed <= bound + SLACK
        ledger.assert_empty()  # no transfer left in flight
        sim.plan.clear()
        await gpu.recover()
        assert await round_trip(gpu, data) == data


async def test_a_lost_completion_and_a_stalled_fence_are_told_apart():
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(CHUNK)
        sim.plan.add(FaultRule(Fault.USB_COMPLETION_LOST, at=1))
        with pytest.raises(UsbTransferTimeout) as lost:
            await gpu.copy_in(buffer, bytes(CHUNK))
        assert lost.value.layer is Layer.USB_TRANSFER
        assert "USB completion was lost" in "".join(lost.value.__notes__)
        await gpu.recover()
        sim.plan.add(FaultRule(Fault.SENTINEL_NEVER_CONSUMED, at=1))
        with pytest.raises(SignalTimeout) as stalled:
            await gpu.copy_in(buffer, bytes(CHUNK))
        assert stalled.value.layer is Layer.GPU_QUEUE
        assert (stalled.value.expected, stalled.value.observed) == (1, 0)


async def test_a_copy_engine_stopped_by_its_watchdog_is_reported_as_such():
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(CHUNK)
        sim.plan.add(FaultRule(Fault.COPY_WATCHDOG, at=1))
        with pytest.raises(GpuFault, match="watchdog") as info:
            await gpu.copy_in(buffer, bytes(CHUNK))
        assert isinstance(info.value.__cause__, SignalTimeout)
        assert 0xF2 in await gpu.recover()  # the SDMA watchdog interrupt is in the IH ring


async def test_a_cancelled_copy_leaves_no_transfer_behind_and_the_next_one_is_exact():
    ledger = Ledger()
    data = os.urandom(6 * CHUNK)
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(len(data))
        sim.plan.add(FaultRule(Fault.USB_COMPLETION_LOST, at=2))  # the copy stalls mid-way
        with use_ledger(ledger):
            with anyio.move_on_after(0.3) as scope:
                await gpu.copy_in(buffer, data)
            assert scope.cancelled_caught
        ledger.assert_empty()  # the transfer in flight was discarded and awaited
        assert gpu.tracker.live() == []
        await gpu.copy_in(buffer, data)  # restores a known state first, then copies
        assert bytes(await gpu.copy_out(buffer)) == data
