"""The model on the simulated accelerator: inputs and outputs cross the copy protocol, and a
device that makes no progress is told from a slow one and from a host too busy to look."""

from __future__ import annotations

import math

import anyio
import numpy as np
import pytest

from aio_runtime import (
    BudgetExhausted,
    HardwareTimeout,
    Layer,
    ReadinessLayer,
    deadline_scope,
    now,
)
from aio_runtime.testing import virtual_time
from pipelines.dms.backends.accelerator import (
    LOOKS_PER_HANG,
    MODEL_KERNEL,
    AcceleratorRunner,
    StallEvidence,
)
from pipelines.dms.backends.sim import simulated_device
from transports.gpu import GpuFault
from transports.gpu.copy import CHUNK
from transports.protocol import gpu as hw
from transports.sim import Fault, FaultRule
from transports.sim.gpu import SimGpu
from transports.sim.usb import SimUsbTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

IMAGE, OUTPUT = 1382400, 553


def infer(img: np.ndarray, calib: np.ndarray) -> np.ndarray:
    """A stand-in model: the output depends on every input, so a wrong byte shows."""
    out = np.zeros((1, OUTPUT), dtype=np.float32)
    out[0, 0] = img.astype(np.float64).sum()
    out[0, 1:4] = calib[0]
    out[0, 4] = img[0, -1]
    return out


async def test_a_run_copies_in_runs_on_the_device_and_copies_out():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, size=(1, IMAGE), dtype=np.uint8)
    calib = np.array([[0.1, -0.2, 0.3]], dtype=np.float32)
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            stats = accelerator.session.copy.stats
            before = (stats.bytes_in, stats.chunks_in, stats.bytes_out, stats.chunks_out)
            output, phases = await accelerator.run(img, calib, timeout=5.0)
            after = (stats.bytes_in, stats.chunks_in, stats.bytes_out, stats.chunks_out)
        finally:
            await accelerator.aclose()
    assert np.array_equal(output, infer(img, calib))
    crossed = tuple(b - a for a, b in zip(before, after, strict=True))
    assert crossed == (IMAGE + 12, math.ceil((IMAGE + 12) / CHUNK), OUTPUT * 4, 1)
    assert min(phases.copy_in, phases.device) > 0 and phases.submit >= 0


async def test_a_hung_device_is_a_gpu_queue_timeout_within_its_bound():
    img = np.zeros((1, IMAGE), dtype=np.uint8)
    calib = np.zeros((1, 3), dtype=np.float32)
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            device.plan.add(FaultRule(Fault.KERNEL_HANG, at=1))
            async with virtual_time():  # the model never runs here: no thread to outpace
                start = now()
                with pytest.raises(HardwareTimeout) as info:
                    await accelerator.run(img, calib, timeout=0.05)
                elapsed = now() - start
            # the kernel's own wait, or the looks' evidence, whichever reaches the bound first
            assert info.value.layer is Layer.GPU_QUEUE
            assert info.value.elapsed >= 0.05 - 1e-6
            assert elapsed <= 0.05 + 2 * 0.05 / LOOKS_PER_HANG
            await accelerator.session.recover()
            output, _ = await accelerator.run(img, calib, timeout=5.0)
            assert output.shape == (1, OUTPUT)
        finally:
            await accelerator.aclose()


async def test_every_frame_crosses_the_bridge_inputs_in_and_output_out():
    """Per run, the copy protocol carries the image and the calibration in (one copy) and the
    output out: nothing is skipped for a frame, however many run."""
    rng = np.random.default_rng(2)
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            stats = accelerator.session.copy.stats
            for _ in range(3):
                img = rng.integers(0, 256, size=(1, IMAGE), dtype=np.uint8)
                calib = rng.normal(size=(1, 3)).astype(np.float32)
                before = (stats.bytes_in, stats.bytes_out, stats.chunks_out)
                output, _ = await accelerator.run(img, calib, timeout=5.0)
                after = (stats.bytes_in, stats.bytes_out, stats.chunks_out)
                assert np.array_equal(output, infer(img, calib))
                crossed = tuple(b - a for a, b in zip(before, after, strict=True))
                assert crossed == (1_382_400 + 12, OUTPUT * 4, 1)
        finally:
            await accelerator.aclose()


async def test_a_run_in_a_long_frame_scope_waits_for_its_kernel_on_the_device():
    """A frame's scope far longer than the copy engine can wait (the service's runs): the run
    still queues its copy-out behind the kernel, so the host learns the kernel finished from the
    copy-out and never waits on the timeline (two bridge requests a read, several a kernel)."""
    img = np.zeros((1, IMAGE), dtype=np.uint8)
    calib = np.zeros((1, 3), dtype=np.float32)
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        timeline = accelerator.session.timeline
        waits: list[int] = []
        wait = timeline.wait

        async def counted(value: int, timeout: float, epoch: int) -> None:
            waits.append(value)
            await wait(value, timeout, epoch)

        timeline.wait = counted  # type: ignore[method-assign]
        limit = accelerator.session.queued_wait_limit
        try:
            with deadline_scope(10 * limit, name="a frame"):
                output, _ = await accelerator.run(img, calib, timeout=0.1)
        finally:
            await accelerator.aclose()
    assert np.array_equal(output, infer(img, calib))
    assert waits == []


# -- the evidence of no progress ---------------------------------------------------------------


def test_no_progress_is_seen_only_once_the_device_was_looked_at_twice():
    evidence = StallEvidence()
    evidence.progressed(0.0, "copied")
    evidence.looked(0.3, "copied")
    assert evidence.stalled == 0.0  # one look, however long after: time passing is no evidence
    evidence.looked(0.325, "copied")
    assert evidence.stalled == pytest.approx(0.325)


def test_time_the_host_was_late_to_look_is_no_evidence_against_the_device():
    evidence = StallEvidence()
    evidence.progressed(0.0, "copied")
    evidence.looked(0.025, "copied")
    evidence.looked(0.5, "copied", late=0.45)  # meant to look at 0.05; not scheduled till 0.5
    assert evidence.stalled == pytest.approx(0.05)


def test_a_new_state_is_progress_and_a_device_that_does_not_answer_makes_none():
    evidence = StallEvidence()
    evidence.progressed(0.0, ("copied", 7))
    evidence.looked(0.05, None)
    evidence.looked(0.1, None)
    assert evidence.stalled == pytest.approx(0.1)
    evidence.looked(0.15, ("copied", 8))  # the timeline moved
    assert evidence.stalled == 0.0 and evidence.looks == 0


def test_time_nobody_looked_is_no_evidence():
    evidence = StallEvidence()
    evidence.progressed(0.0, "copied")
    evidence.looked(0.025, "copied")
    evidence.paused(1.0)  # between runs, nobody looked
    evidence.looked(1.025, "copied")
    assert evidence.stalled == pytest.approx(0.05)


def slow_kernel(seconds: float):
    """The model as a kernel that takes ``seconds`` of simulated time (no thread: exact in
    virtual time)."""

    def kernel(gpu: SimGpu, image: int, calib: int, output: int) -> None:
        img = gpu.view(image, IMAGE).reshape(1, IMAGE)
        cal = gpu.view(calib, 12).view(np.float32).reshape(1, 3)
        gpu.view(output, OUTPUT * 4)[:] = infer(img, cal).reshape(-1).view(np.uint8)

    return kernel, seconds


async def run_watched(accelerator: AcceleratorRunner, *, budget: float, away: float = 0.0):
    """Run once in a deadline scope of ``budget``, the host away (not scheduled: the clock
    jumps) for ``away`` seconds 10 ms in; the largest stall seen meanwhile, and the outcome."""
    img = np.arange(IMAGE, dtype=np.uint64).astype(np.uint8).reshape(1, IMAGE)
    calib = np.zeros((1, 3), dtype=np.float32)
    seen: list[float] = []
    outcome: list[object] = []
    async with virtual_time() as clock:

        async def frame() -> None:
            try:
                with deadline_scope(budget, name="frame"):
                    outcome.append((await accelerator.run(img, calib, timeout=0.1))[0])
            except (HardwareTimeout, BudgetExhausted) as exc:
                outcome.append(exc)
            watch.cancel_scope.cancel()

        async def watcher() -> None:
            while True:
                seen.append(await accelerator.stalled_for())
                await anyio.sleep(0.005)

        async def host_away() -> None:
            await anyio.sleep(0.01)
            clock.jump(away)

        async with anyio.create_task_group() as watch:
            watch.start_soon(frame)
            watch.start_soon(watcher)
            if away:
                watch.start_soon(host_away)
    return max(seen), outcome[0]


async def test_a_kernel_that_makes_no_progress_while_the_host_looks_is_hung_at_its_bound():
    """A kernel that shows no progress for a second, in a frame's scope of 0.3 s: the looks
    (every 25 ms) see it stalled, and at the hang bound (0.1 s of evidence) the run ends hung
    there and then, not at the scope's end."""
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        device.gpu.register_kernel(MODEL_KERNEL, *slow_kernel(1.0))
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            stalled, outcome = await run_watched(accelerator, budget=0.3)
        finally:
            await accelerator.aclose()
    assert isinstance(outcome, HardwareTimeout) and outcome.layer is Layer.GPU_QUEUE
    assert not isinstance(outcome, BudgetExhausted)
    assert "no progress: hung" in str(outcome) and 0.1 - 1e-6 <= outcome.elapsed < 0.1 + 0.03
    assert 0.05 <= stalled <= outcome.elapsed  # seen growing, look by look, up to the bound


async def test_time_the_runtime_s_threads_waited_for_a_cpu_is_no_evidence_of_a_hung_device(
    monkeypatch,
):
    """The kernel that makes no progress for a second, but every look finds that the runtime's
    threads (the simulated GPU's kernel among them) waited for a CPU all along: a starved host,
    not a hung device — the run is cut by its frame's scope, never ended as hung."""
    from aio_runtime import Starvation

    monkeypatch.setattr(Starvation, "since_last", lambda self: 1.0)  # starved throughout
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        device.gpu.register_kernel(MODEL_KERNEL, *slow_kernel(1.0))
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            stalled, outcome = await run_watched(accelerator, budget=0.3)
        finally:
            await accelerator.aclose()
    assert isinstance(outcome, BudgetExhausted), outcome
    assert stalled == 0.0


async def test_a_host_that_was_not_scheduled_is_no_evidence_of_a_hung_device():
    """The host is away for 0.3 s (three hang bounds) while a 0.34 s kernel runs: back, it
    looks twice more before the kernel finishes. The looks it missed are no evidence against
    the device (only the 50 ms it did look are), and the run completes."""
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        device.gpu.register_kernel(MODEL_KERNEL, *slow_kernel(0.34))
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            stalled, outcome = await run_watched(accelerator, budget=1.0, away=0.3)
        finally:
            await accelerator.aclose()
    assert isinstance(outcome, np.ndarray) and outcome.shape == (1, OUTPUT)
    assert stalled < 0.1


async def test_a_look_that_finds_the_device_in_its_error_state_ends_the_run():
    """The model's output arriving is the kernel's completion, so nothing reads the timeline
    while the kernel runs but the looks: one that finds the error state (a page fault) ends the
    run with a GpuFault then, not when the frame's budget runs out."""
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            img = np.zeros((1, IMAGE), dtype=np.uint8)
            calib = np.zeros((1, 3), dtype=np.float32)
            device.plan.add(FaultRule(Fault.IH_FAULT, at=1))
            async with virtual_time():
                start = now()
                with deadline_scope(1.0, name="frame"), pytest.raises(GpuFault) as info:
                    await accelerator.run(img, calib, timeout=0.1)
                elapsed = now() - start
            readiness = accelerator.session.readiness
            assert not readiness.is_up(ReadinessLayer.QUEUE_SUBMITTABLE)
        finally:
            await accelerator.aclose()
    assert info.value.source == hw.Interrupt.UTCL2_FAULT
    assert elapsed <= 0.1 / LOOKS_PER_HANG + 0.01  # the first look
