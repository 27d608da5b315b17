"""The device session over the in-process simulator: boot, memory, kernels, ordering, faults,
recovery, close."""

from __future__ import annotations

import math

import anyio
import numpy as np
import pytest
from gpu_sim import ADD_ONE, FAILS, FAST, SLACK, SLOW, SLOW_ADD_ONE, device, reopen, session

from aio_runtime import (
    BudgetExhausted,
    DeviceLost,
    FirmwareError,
    FirmwareTimeout,
    Layer,
    Ledger,
    OutOfMemory,
    PcieRequestTimeout,
    ReadinessLayer,
    SignalTimeout,
    TransferError,
    UsbTransferTimeout,
    deadline_scope,
    now,
    use_ledger,
)
from aio_runtime.testing import virtual_time
from transports.gpu import GpuFault
from transports.protocol import gpu as hw
from transports.sim import Fault, FaultRule

pytestmark = pytest.mark.anyio

FULL_BOOT = [
    "SOC",
    "readiness: device_online",
    "GMC",
    "IH",
    *["PSP"] * (len(hw.PspComponent) + 1 + 2 + len(hw.Firmware) + 1),
    "SMU",
    "readiness: firmware_ready",
    "GFX",
    "SDMA",
    "readiness: queue_submittable",
]


def blocks(steps: list[str]) -> list[str]:
    return [s if s.startswith("readiness") else s.split(":")[0].split()[0] for s in steps]


async def test_a_full_boot_runs_the_blocks_in_order_and_marks_readiness():
    async with session() as (sim, gpu):
        assert gpu.boot_log.mode == "full"
        assert blocks(gpu.boot_log.steps) == FULL_BOOT
        assert sim.gpu.psp.loaded == list(hw.PspComponent)  # the sOS components, in order
        assert sim.gpu.firmware == list(hw.Firmware)
        assert [m for m, _ in sim.gpu.smu.messages] == [
            hw.SmuMessage.DRIVER_TABLE_HIGH,
            hw.SmuMessage.DRIVER_TABLE_LOW,
            hw.SmuMessage.ENABLE_ALL_FEATURES,
        ]
        assert gpu.readiness.is_up(ReadinessLayer.QUEUE_SUBMITTABLE)


async def test_after_a_clean_close_the_next_open_boots_partially():
    async with device() as sim:
        first = await reopen(sim)
        await first.aclose()
        assert not first.readiness.is_up(ReadinessLayer.DEVICE_ONLINE)
        second = await reopen(sim)
        try:
            assert second.boot_log.mode == "partial"
            assert "PSP: sOS running (partial boot)" in second.boot_log.steps
            assert sim.gpu.smu.messages[-1][0] == hw.SmuMessage.TEST  # no firmware reloaded
            assert blocks(second.boot_log.steps)[-4:] == [
                "readiness: firmware_ready",
                "GFX",
                "SDMA",
                "readiness: queue_submittable",
            ]
        finally:
            await second.aclose()


@pytest.mark.parametrize("how", ["not closed", "power cycle", "page fault"])
async def test_partial_boot_only_when_the_scratch_registers_allow(how):
    async with virtual_time(), device() as sim:
        first = await reopen(sim)
        if how == "page fault":
            sim.plan.add(FaultRule(Fault.IH_FAULT, at=1))
            buffer = await first.alloc(16)
            with pytest.raises(GpuFault):
                await first.run_kernel(ADD_ONE, [buffer, buffer, 16])
        if how != "not closed":
            await first.aclose()
        if how == "power cycle":
            sim.bridge.unplug()  # it re-enumerates powered off: the GPU lost everything
        second = await reopen(sim)
        try:
            assert second.boot_log.mode == "full"
            # firmware was running: the full boot starts with a mode-1 reset, unless power went
            reset = "SOC: mode-1 reset (firmware was running)" in second.boot_log.steps
            assert reset is (how != "power cycle")
        finally:
            await second.aclose()


@pytest.mark.parametrize(
    ("fault", "params", "error", "bound"),
    [
        (Fault.SMU_NO_RESPONSE, {}, FirmwareTimeout, FAST.firmware_timeout),
        (Fault.SMU_ERROR_CODE, {"code": 0xFE}, FirmwareError, 0.0),
        (Fault.PSP_RING_TIMEOUT, {}, FirmwareTimeout, FAST.firmware_timeout),
        (Fault.PSP_ERROR_STATUS, {"status": 0x7}, FirmwareError, 0.0),
    ],
)
async def test_firmware_faults_fail_the_boot_typed_and_a_later_boot_succeeds(
    fault, params, error, bound
):
    # An SMU message left unanswered is sent again (test_gpu_recovery.py): the SMU that fails
    # the boot is one that answers none of them.
    count = math.inf if fault is Fault.SMU_NO_RESPONSE else 1
    ledger = Ledger()
    async with virtual_time(), device(FaultRule(fault, at=1, count=count, params=params)) as sim:
        start = now()
        with use_ledger(ledger), pytest.raises(error) as info:
            await reopen(sim)
        assert info.value.layer is Layer.FIRMWARE
        assert now() - start <= bound + FAST.mode1_reset_pause + SLACK
        if error is FirmwareError:
            assert info.value.code == params.get("code", params.get("status"))
        ledger.assert_empty()
        sim.plan.clear()
        gpu = await reopen(sim)  # firmware half-loaded: full boot with a mode-1 reset
        assert gpu.readiness.is_up(ReadinessLayer.QUEUE_SUBMITTABLE)
        await gpu.aclose()


async def test_memory_is_staged_and_freed_on_every_path():
    ledger = Ledger()
    async with virtual_time(), session() as (sim, gpu):
        with use_ledger(ledger):
            free_before = gpu.heap.statistics().free
            sim.plan.add(FaultRule(Fault.USB_TIMEOUT, at=1))
            with pytest.raises(UsbTransferTimeout):
                await gpu.alloc(4096, zero=True)  # zeroing fails: the VRAM goes back
            assert gpu.heap.statistics().free == free_before
            with pytest.raises(OutOfMemory):
                await gpu.alloc(1 << 40)
            buffer = await gpu.alloc(4096, zero=True)
            mapping = gpu.map_host(bytearray(16))
            gpu.unmap(mapping)
            with pytest.raises(ValueError, match="unmapped twice"):
                gpu.unmap(mapping)
            await gpu.free(buffer)
            with pytest.raises(ValueError, match="freed twice"):
                await gpu.free(buffer)
            left = await gpu.alloc(64)  # still allocated at close: close frees it
            gpu.map_host(bytearray(8))
            await gpu.aclose()
            assert left not in gpu._buffers
        ledger.assert_empty()


async def test_a_kernel_runs_on_the_compute_queue_and_signals_the_timeline():
    async with session() as (_, gpu):
        source, target = await gpu.alloc(256), await gpu.alloc(256)
        await gpu.copy_in(source, bytes(range(256)))
        first = await gpu.run_kernel(
            ADD_ONE, [source, target, 256], reads=[source], writes=[target]
        )
        second = await gpu.run_kernel(
            ADD_ONE, [target, target, 256], reads=[target], writes=[target]
        )
        assert second == first + 1
        out = np.frombuffer(await gpu.copy_out(target), dtype=np.uint8)
        assert np.array_equal(out, (np.arange(256) + 2).astype(np.uint8))


async def test_overlapping_work_waits_across_queues_and_the_rest_runs_concurrently():
    async with virtual_time(), session() as (_, gpu):
        a, b = await gpu.alloc(4096), await gpu.alloc(4096)
        result = await gpu.alloc(4096)
        done: dict[str, float] = {}
        start = now()

        async def kernel():
            await gpu.run_kernel(SLOW_ADD_ONE, [a, result, 4096], reads=[a], writes=[result])
            done["kernel"] = now() - start

        async def copy(name, buffer):
            await gpu.copy_in(buffer, bytes(4096))
            done[name] = now() - start

        async def read_result():
            await gpu.copy_out(result)
            done["copy-out of the result"] = now() - start

        async with anyio.create_task_group() as tg:
            tg.start_soon(kernel)
            await anyio.sleep(0.1)  # the kernel is running
            tg.start_soon(copy, "copy-in elsewhere", b)
            tg.start_soon(copy, "copy-in over its input", a)
            tg.start_soon(read_result)
        assert done["copy-in elsewhere"] < 0.2  # overlapped the kernel
        for name in ("copy-in over its input", "copy-out of the result"):
            assert done[name] >= done["kernel"] >= SLOW


@pytest.mark.parametrize(
    ("fault", "kernel", "error", "source"),
    [
        (Fault.KERNEL_HANG, ADD_ONE, SignalTimeout, None),
        (Fault.IH_FAULT, ADD_ONE, GpuFault, hw.Interrupt.UTCL2_FAULT),
        (None, FAILS, GpuFault, hw.Interrupt.SQ_ERROR),
    ],
)
@pytest.mark.parametrize("chained", [False, True], ids=["timeline", "copy-out behind it"])
async def test_compute_faults_are_typed_and_recover_clears_them(
    fault, kernel, error, source, chained
):
    """Awaited on the timeline or through the copy-out queued behind it, a kernel that hangs, a
    page fault and a kernel that fails are told apart alike."""
    ledger = Ledger()
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(64)
        if fault is not None:
            sim.plan.add(FaultRule(fault, at=1))
        start = now()
        with use_ledger(ledger), pytest.raises(error) as info:
            if chained:
                await gpu.run_kernel_and_copy_out(kernel, [buffer, buffer, 64], buffer)
            else:
                await gpu.run_kernel(kernel, [buffer, buffer, 64])
        assert info.value.layer is Layer.GPU_QUEUE
        if error is SignalTimeout:
            assert info.value.awaited == "compute timeline >= 1"
        assert now() - start <= FAST.kernel_timeout + SLACK
        ledger.assert_empty()
        if source is not None:
            assert info.value.source == source
            assert not gpu.readiness.is_up(ReadinessLayer.QUEUE_SUBMITTABLE)
        interrupts = await gpu.recover()
        assert (source in interrupts) if source is not None else interrupts == []
        assert gpu.tracker.live() == []
        await gpu.run_kernel(ADD_ONE, [buffer, buffer, 64])  # no sticky error
        assert sim.gpu.error == 0


async def test_a_kernel_that_completes_as_a_recovery_begins_stands():
    """A recovery starts a new epoch before it reads how far the timeline got: a kernel whose
    completion is seen in between was not lost to it."""
    async with virtual_time(), session() as (_, gpu):
        buffer = await gpu.alloc(64)
        done = []
        async with anyio.create_task_group() as tg:

            async def run() -> None:
                done.append(await gpu.run_kernel(SLOW_ADD_ONE, [buffer, buffer, 64]))

            tg.start_soon(run)
            await anyio.sleep(SLOW / 2)  # the kernel is running on the device
            gpu.timeline.lose_pending()  # a recovery's first step; the timeline is not read yet
        assert done == [1]


@pytest.mark.parametrize("chained", [False, True], ids=["timeline", "copy-out behind it"])
async def test_a_frame_budget_bounds_a_kernel_wait_and_the_kernel_lingers(chained):
    async with virtual_time(), session() as (_, gpu):
        buffer = await gpu.alloc(64)
        await gpu.copy_in(buffer, bytes(64))
        with deadline_scope(0.05, name="frame 9"), pytest.raises(BudgetExhausted) as info:
            args, reads = [buffer, buffer, 64], [buffer]
            if chained:
                await gpu.run_kernel_and_copy_out(SLOW_ADD_ONE, args, buffer, reads=reads)
            else:
                await gpu.run_kernel(SLOW_ADD_ONE, args, reads=reads, writes=[buffer])
        assert info.value.layer is Layer.GPU_QUEUE
        assert "compute timeline >= 1" in info.value.awaited
        assert [w.lingering for w in gpu.tracker.live()] == [True]  # it may still run
        start = now()
        await gpu.copy_in(buffer, b"\x05" * 64)  # waits for the lingering kernel, then goes on
        assert now() - start >= SLOW - 0.05 - SLACK and gpu.tracker.live() == []
        assert bytes(await gpu.copy_out(buffer)) == b"\x05" * 64


async def test_the_copy_out_behind_a_kernel_brings_its_output_without_reading_the_timeline():
    async with session() as (_, gpu):
        source, target = await gpu.alloc(256), await gpu.alloc(256)
        await gpu.copy_in(source, bytes(range(256)))
        bytes_out = gpu.copy.stats.bytes_out

        async def no_reads() -> tuple[int, int]:
            raise AssertionError("the timeline was read")

        gpu.timeline.read_state = no_reads  # type: ignore[method-assign]
        value, data = await gpu.run_kernel_and_copy_out(
            ADD_ONE, [source, target, 256], target, reads=[source]
        )
        assert value == 1 and bytes(data) == bytes((np.arange(256) + 1).astype(np.uint8))
        assert gpu.copy.stats.bytes_out == bytes_out + 256
        assert gpu.tracker.live() == []
        # The next kernel follows on the timeline.
        value, data = await gpu.run_kernel_and_copy_out(
            ADD_ONE, [target, target, 256], target, reads=[target]
        )
        assert value == 2 and bytes(data) == bytes((np.arange(256) + 2).astype(np.uint8))


@pytest.mark.parametrize("limit", ["watchdog", "wrapped timeline"])
async def test_past_the_copy_engines_limits_the_kernel_is_awaited_on_the_timeline(limit):
    """A bound the copy engine's watchdog would not wait out, or a timeline value just after
    the 32-bit wrap (where the engine's unsigned compare would be met at once): the timeline is
    awaited, then the output copied out — the same result."""
    async with session() as (_, gpu):
        buffer = await gpu.alloc(16)
        await gpu.copy_in(buffer, bytes(16))
        timeout = FAST.copy_watchdog_ms / 1000 if limit == "watchdog" else None
        if limit == "wrapped timeline":
            gpu.timeline.next_value = (1 << 32) + 1  # the device's word reads 0 before it
        reads = []
        read_state = gpu.timeline.read_state

        async def counted() -> tuple[int, int]:
            reads.append(1)
            return await read_state()

        gpu.timeline.read_state = counted  # type: ignore[method-assign]
        value, data = await gpu.run_kernel_and_copy_out(
            ADD_ONE, [buffer, buffer, 16], buffer, timeout=timeout
        )
        assert bytes(data) == b"\x01" * 16 and reads
        assert value == gpu.timeline.next_value - 1


@pytest.mark.parametrize(
    ("fault", "error", "layer"),
    [
        (Fault.USB_TIMEOUT, UsbTransferTimeout, Layer.USB_TRANSFER),
        (Fault.SHORT_TRANSFER, TransferError, Layer.USB_TRANSFER),
        (Fault.TLP_RETRY_STORM, TransferError, Layer.PCIE_REQUEST),
        (Fault.DISCONNECT, DeviceLost, Layer.USB_TRANSFER),
    ],
)
async def test_usb_and_pcie_faults_in_a_session_are_typed_and_a_new_session_recovers(
    fault, error, layer
):
    ledger = Ledger()
    async with virtual_time(), session() as (sim, gpu):
        buffer = await gpu.alloc(4096)
        sim.plan.add(FaultRule(fault, at=1, count=math.inf))
        start = now()
        with use_ledger(ledger), pytest.raises(error) as info:
            if fault is Fault.TLP_RETRY_STORM:  # register reads are the requests that complete
                await gpu.recover()
            else:
                await gpu.run_kernel(ADD_ONE, [buffer, buffer, 4096])
        assert info.value.layer is layer
        assert now() - start <= FAST.request_timeout + SLACK
        ledger.assert_empty()
        sim.plan.clear()
        await gpu.aclose()  # as a supervisor does: close the failed session, open a new one
        again = await reopen(sim)
        try:
            await again.run_kernel(ADD_ONE, [buffer.address, buffer.address, 16])
        finally:
            await again.aclose()


async def test_the_link_bring_up_is_bounded():
    async with virtual_time(), device(link_latency=5.0) as sim:
        with pytest.raises(PcieRequestTimeout) as info:
            await reopen(sim)
        assert "PCIe link up" in info.value.awaited
