"""The device session under concurrency and after faults: ordering, recovery, close, rings."""

from __future__ import annotations

import contextlib
import math

import anyio
import pytest
from gpu_sim import ADD_ONE, FAST, SLACK, SLOW, SLOW_ADD_ONE, device, reopen, session

from aio_runtime import Layer, SignalTimeout, UsbTransferTimeout, now
from aio_runtime.testing import virtual_time
from transports.gpu import DependencyFailed, GpuFault, GpuSession
from transports.gpu.copy import CHUNK
from transports.gpu.session import Buffer
from transports.protocol import gpu as hw
from transports.protocol.bridge import SRAM_SIZE
from transports.sim import Fault, FaultRule
from transports.sim.server import SimServer
from transports.sim.usb import SimUsbTransport

pytestmark = pytest.mark.anyio


def part(buffer: Buffer, offset: int, size: int) -> Buffer:
    return Buffer(buffer.address + offset, size, buffer.owner)


async def test_a_later_write_never_overtakes_an_earlier_read_of_the_same_bytes():
    async with virtual_time(), session() as (_, gpu):
        data, source = await gpu.alloc(8192), await gpu.alloc(4096)
        await gpu.copy_in(data, b"\x11" * 8192)
        x, z = part(data, 0, 4096), part(data, 4096, 4096)
        seen = {}

        async def kernel_writing_z():
            await gpu.run_kernel(SLOW_ADD_ONE, [source, z, 4096], reads=[source], writes=[z])

        async def read_x_and_z():  # waits for the kernel (it reads z)
            seen["x"] = bytes(await gpu.copy_out(data))[:8]

        async def write_x():  # issued after the read: must not land before it
            await gpu.copy_in(x, b"\x99" * 8)

        async with anyio.create_task_group() as tg:
            tg.start_soon(kernel_writing_z)
            await anyio.sleep(0.01)
            tg.start_soon(read_x_and_z)
            await anyio.sleep(0.01)
            tg.start_soon(write_x)
        assert seen["x"] == b"\x11" * 8


async def test_a_kernel_that_timed_out_keeps_its_bytes_until_recovery_then_readers_fail():
    async with virtual_time(), session() as (sim, gpu):
        target = await gpu.alloc(64)
        sim.plan.add(FaultRule(Fault.KERNEL_HANG, at=1))
        outcome = {}

        async def producer():
            with pytest.raises(SignalTimeout):
                await gpu.run_kernel(ADD_ONE, [target, target, 64], writes=[target], timeout=1.0)

        async def consumer():
            try:
                await gpu.copy_out(target)
            except DependencyFailed as exc:
                outcome["consumer"] = (exc, now())

        async def free():
            await gpu.free(target)
            outcome["freed"] = now()

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.sleep(1.5)  # the producer has timed out; its kernel may still run
            tg.start_soon(consumer)
            tg.start_soon(free)
            await anyio.sleep(5.0)
            assert outcome == {}  # both wait: the device may still write those bytes
            recovered = now()
            await gpu.recover()  # the queue is reset: the kernel will never run
        exc, when = outcome["consumer"]
        assert exc.layer is Layer.GPU_QUEUE and "kernel 1" in str(exc)
        assert when == recovered and outcome["freed"] == recovered


async def test_work_waiting_for_a_slow_kernel_whose_wait_timed_out_goes_on_when_it_finishes():
    # Nothing else waits on the device: the waiting copy reads the timeline itself, so a kernel
    # that was only slow does not hold its bytes until some later kernel happens to be awaited.
    async with virtual_time(), session() as (_, gpu):
        source, out = await gpu.alloc(64), await gpu.alloc(64)
        await gpu.copy_in(source, b"\x01" * 64)
        submitted = []
        with pytest.raises(SignalTimeout):
            await gpu.run_kernel(
                SLOW_ADD_ONE,
                [source, out, 64],
                reads=[source],
                writes=[out],
                timeout=SLOW / 4,
                on_submitted=lambda: submitted.append(now()),
            )
        await gpu.copy_in(source, b"\x07" * 64)  # waits for the kernel reading it, then goes on
        assert SLOW <= now() - submitted[0] <= SLOW + SLACK
        assert bytes(await gpu.copy_out(out)) == b"\x02" * 64  # the slow kernel's own result
        assert bytes(await gpu.copy_out(source)) == b"\x07" * 64


async def test_a_write_after_failed_work_goes_ahead():
    async with virtual_time(), session() as (_, gpu):
        buffer = await gpu.alloc(64)
        with anyio.move_on_after(0.0):  # a read cancelled before it touched the device
            await gpu.copy_out(buffer)
        await gpu.copy_in(buffer, b"\x05" * 64)  # the next frame's write is not held against it
        assert bytes(await gpu.copy_out(buffer)) == b"\x05" * 64


async def test_a_kernel_that_completed_before_a_recovery_stands():
    async with virtual_time(), session() as (_, gpu):
        buffer = await gpu.alloc(64)
        outcome = {}

        async def waiter():  # it polls the timeline only every so often
            outcome["value"] = await gpu.run_kernel(SLOW_ADD_ONE, [buffer, buffer, 64])

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(SLOW + 0.0001)  # done on the device, maybe not yet seen
            await gpu.recover()
        assert outcome["value"] == 1
        assert bytes(await gpu.copy_out(buffer, 4)) == b"\x01" * 4


async def test_recover_does_not_wait_behind_submissions_queued_for_a_full_ring():
    small = FAST.__class__(**{**FAST.__dict__, "compute_ring_size": 256})
    async with virtual_time(), session(config=small) as (sim, gpu):
        buffer = await gpu.alloc(64)
        sim.plan.add(FaultRule(Fault.KERNEL_HANG, at=1))
        errors = []

        async def submit():
            try:
                await gpu.run_kernel(ADD_ONE, [buffer, buffer, 64], timeout=1.0)
            except (SignalTimeout, GpuFault) as exc:
                errors.append(type(exc).__name__)

        async with anyio.create_task_group() as tg:
            for _ in range(20):  # far more than a 256-byte ring holds behind a hung kernel
                tg.start_soon(submit)
            await anyio.sleep(0.5)
            start = now()
            await gpu.recover()
            took = now() - start
        assert took <= 1.0 + 0.1  # at most the one submission waiting for ring space
        assert len(errors) == 20
        await gpu.run_kernel(ADD_ONE, [buffer, buffer, 64])


async def test_a_kernel_lost_to_a_recovery_fails_rather_than_reporting_success():
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(64)
        sim.plan.add(FaultRule(Fault.KERNEL_HANG, at=1))
        outcome = {}

        async def waiter():
            try:
                await gpu.run_kernel(ADD_ONE, [buffer, buffer, 64], timeout=30.0)
                outcome["waiter"] = "success"
            except GpuFault as exc:
                outcome["waiter"] = str(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(1.0)
            await gpu.recover()
        assert "lost to a device recovery" in outcome["waiter"]
        await gpu.run_kernel(ADD_ONE, [buffer, buffer, 64])


async def test_a_cancelled_copy_stops_the_copy_engine_so_its_watchdog_never_fires_later():
    async with virtual_time(), session() as (sim, gpu):
        buffer, other = await gpu.alloc(4 * CHUNK), await gpu.alloc(64)
        sim.plan.add(FaultRule(Fault.SENTINEL_NEVER_CONSUMED, at=1))
        with anyio.move_on_after(0.2):
            await gpu.copy_in(buffer, bytes(4 * CHUNK))
        engine = sim.gpu.copy
        assert engine.rptr == engine.wptr and not engine.halted
        await anyio.sleep(FAST.copy_watchdog_ms / 1000 + 1)  # long past the watchdog
        assert sim.gpu.error == 0
        await gpu.run_kernel(ADD_ONE, [other, other, 64])


async def test_close_stops_the_queues_and_the_next_partial_boot_finds_a_clean_device():
    async with virtual_time(), device() as sim:
        gpu = await reopen(sim)
        buffer = await gpu.alloc(4 * CHUNK)
        sim.plan.add(FaultRule(Fault.SENTINEL_NEVER_CONSUMED, at=1))
        with anyio.move_on_after(0.2):
            await gpu.copy_in(buffer, bytes(4 * CHUNK))
        await gpu.aclose()
        assert not sim.gpu.copy.enabled and not sim.gpu.compute.enabled
        await anyio.sleep(FAST.copy_watchdog_ms / 1000 + 1)
        again = await reopen(sim)
        try:
            assert again.boot_log.mode == "partial"
            scratch = await again.alloc(64)
            await again.run_kernel(ADD_ONE, [scratch, scratch, 64])
        finally:
            await again.aclose()


async def test_a_device_left_in_its_error_state_is_booted_fully():
    async with virtual_time(), device() as sim:
        gpu = await reopen(sim)
        await gpu.aclose()
        sim.gpu.interrupt(hw.Interrupt.SQ_ERROR)  # after the clean close
        again = await reopen(sim)
        try:
            assert again.boot_log.mode == "full"
            assert sim.gpu.error == 0
        finally:
            await again.aclose()


async def test_a_stalled_copy_out_does_not_hold_up_kernels_on_other_buffers():
    async with virtual_time(), session() as (sim, gpu):
        source, result = await gpu.alloc(CHUNK), await gpu.alloc(64)
        sim.plan.add(FaultRule(Fault.COPYOUT_RELEASE_NEVER, at=1))
        finished = {}

        async def stalled_copy():
            with contextlib.suppress(UsbTransferTimeout):
                await gpu.copy_out(source)
            finished["copy"] = now()

        async def kernels():
            for _ in range(3):
                await gpu.run_kernel(ADD_ONE, [result, result, 64], reads=[result], writes=[result])
            finished["kernels"] = now()

        start = now()
        async with anyio.create_task_group() as tg:
            tg.start_soon(stalled_copy)
            await anyio.sleep(0.01)
            tg.start_soon(kernels)
        assert finished["kernels"] - start < 0.1 < finished["copy"] - start


async def test_freeing_a_buffer_waits_for_the_work_on_it():
    async with virtual_time(), session() as (_, gpu):
        source, target = await gpu.alloc(4096), await gpu.alloc(4096)
        freed = {}

        async def kernel():
            await gpu.run_kernel(
                SLOW_ADD_ONE, [source, target, 4096], reads=[source], writes=[target]
            )

        async def free_then_reuse():
            await gpu.free(target)
            freed["at"] = now()
            reused = await gpu.alloc(4096, zero=True)
            freed["same address"] = reused.address == target.address
            freed["bytes"] = bytes(await gpu.copy_out(reused, 8))

        start = now()
        async with anyio.create_task_group() as tg:
            tg.start_soon(kernel)
            await anyio.sleep(0.01)
            tg.start_soon(free_then_reuse)
        assert freed["at"] - start >= SLOW
        assert freed["same address"] and freed["bytes"] == bytes(8)


# A hundred waiters, each polling the timeline through the bridge: 160k reads of it, 30-45 s.
@pytest.mark.timeout(240)
async def test_more_kernels_than_the_ring_holds_all_run_none_overwritten():
    small = FAST.__class__(**{**FAST.__dict__, "compute_ring_size": 1024})
    async with virtual_time(), session(config=small) as (sim, gpu):
        slow, buffer = await gpu.alloc(64), await gpu.alloc(64)
        count = 100  # 48-byte packets: more than a 1 KiB ring holds at once
        done = []

        async def one():
            done.append(await gpu.run_kernel(ADD_ONE, [buffer, buffer, 0]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(gpu.run_kernel, SLOW_ADD_ONE, [slow, slow, 64])
            await anyio.sleep(0.01)
            for _ in range(count):
                tg.start_soon(one)
        assert len(done) == count == len(set(done))
        assert sim.gpu.compute.executed == 2 * (count + 1)  # a dispatch and a release each


async def test_ring_pointers_wrap_at_32_bits():
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(64)
        start = 2**32 - 0x30  # after ~4 GiB of packets
        gpu.compute.wptr = gpu.compute._rptr = start
        sim.gpu.compute.wptr = sim.gpu.compute.rptr = start
        for _ in range(3):
            await gpu.run_kernel(ADD_ONE, [buffer, buffer, 64])
        assert gpu.compute.wptr < 0x100 and sim.gpu.compute.rptr == gpu.compute.wptr


@pytest.mark.parametrize("fault", [Fault.COPYOUT_RELEASE_NEVER, Fault.COPY_WATCHDOG])
async def test_copy_out_faults_on_the_threaded_simulator_recover(fault):
    config = FAST.__class__(**{**FAST.__dict__, "bulk_timeout": 1.0, "fence_timeout": 1.0})
    with SimServer(device) as server:
        usb = SimUsbTransport(server.device.bridge, call=server.call)
        async with await GpuSession.open(usb, config=config) as gpu:
            buffer = await gpu.alloc(CHUNK + 5)
            await gpu.copy_in(buffer, b"\x42" * (CHUNK + 5))
            server.run(server.device.plan.add, FaultRule(fault, at=1))
            with anyio.fail_after(10), pytest.raises((UsbTransferTimeout, GpuFault)) as info:
                await gpu.copy_out(buffer)
            assert info.value.layer in (Layer.USB_TRANSFER, Layer.GPU_QUEUE)
            server.run(server.device.plan.clear)
            await gpu.recover()
            for _ in range(3):
                assert bytes(await gpu.copy_out(buffer)) == b"\x42" * (CHUNK + 5)


async def test_a_lost_bulk_transfer_is_a_usb_timeout_of_that_transfer():
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(CHUNK)
        # the 6th transfer of a copy-in: chunk 0's bulk OUT (after the fence reset, the program's
        # stream request and data, the doorbell and the arm)
        sim.plan.add(FaultRule(Fault.USB_TIMEOUT, at=6))
        start = now()
        with pytest.raises(UsbTransferTimeout) as info:
            await gpu.copy_in(buffer, bytes(CHUNK))
        assert info.value.layer is Layer.USB_TRANSFER
        assert info.value.awaited.startswith(f"bulk OUT ep 0x02 ({SRAM_SIZE // 2} bytes)")
        assert math.isclose(now() - start, FAST.bulk_timeout, abs_tol=0.2)
        await gpu.copy_in(buffer, bytes(CHUNK))  # restores a known state first


async def test_a_stalled_copy_in_does_not_fail_kernels_on_other_buffers():
    async with virtual_time(), session() as (sim, gpu):
        data, result = await gpu.alloc(3 * CHUNK), await gpu.alloc(64)
        sim.plan.add(FaultRule(Fault.SENTINEL_NEVER_CONSUMED, at=1))
        outcome = {}

        async def stalled_copy():
            with contextlib.suppress(SignalTimeout):
                await gpu.copy_in(data, bytes(3 * CHUNK))
            outcome["copy"] = now()

        async def kernel():  # its submission waits for the bulk OUT pipe, then runs
            await gpu.run_kernel(ADD_ONE, [result, result, 64], reads=[result], writes=[result])
            outcome["kernel"] = now()

        start = now()
        async with anyio.create_task_group() as tg:
            tg.start_soon(stalled_copy)
            await anyio.sleep(0.01)
            tg.start_soon(kernel)
        assert outcome["kernel"] - start <= FAST.fence_timeout + 0.2
        assert outcome["copy"] - start <= FAST.fence_timeout + 0.2


async def test_recover_while_copies_run_on_the_threaded_simulator_never_corrupts_data():
    config = FAST.__class__(**{**FAST.__dict__, "bulk_timeout": 0.3, "fence_timeout": 0.3})
    with SimServer(device) as server:
        usb = SimUsbTransport(server.device.bridge, call=server.call)
        async with await GpuSession.open(usb, config=config) as gpu:
            buffers = [await gpu.alloc(CHUNK + 64) for _ in range(2)]

            async def copies(index: int, byte: int) -> None:
                payload = bytes([byte]) * (CHUNK + 64)
                for _ in range(8):
                    with contextlib.suppress(SignalTimeout, UsbTransferTimeout, GpuFault):
                        await gpu.copy_in(buffers[index], payload)
                        got = bytes(await gpu.copy_out(buffers[index]))
                        assert got == payload  # a copy that succeeds is exact

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(copies, 0, 0x11)
                    tg.start_soon(copies, 1, 0x22)
                    for _ in range(6):
                        await anyio.sleep(0.003)
                        await gpu.recover()
