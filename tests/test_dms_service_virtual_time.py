"""The DMS service in virtual time: a hung accelerator makes it UNAVAILABLE within its deadline,
to the microsecond, and it is AVAILABLE again once the fault clears.

Under :func:`~aio_runtime.testing.virtual_time` the loop clock jumps to the next timer whenever
every task waits. The service also waits for work on threads, which takes real time: the warp (a
``WorkerThread``), the model (onnxruntime, run by the simulated GPU's kernel through
``anyio.to_thread``) and the start-up calls. With ``hold=threads_busy(ledger)`` the clock stands
still while any of them runs, so they take no virtual time: every instant in the run is set by the
timers alone (the camera's frame period, the frame deadlines, the restart backoff), the same on
every run and on any machine, however loaded.

An autojump threshold alone is no substitute: while a thread runs, the service's short poll timers
(the compute timeline's 0.2-5 ms backoff) still expire and move the clock at real-time speed, and the
start-up thread calls need a threshold over ~0.1 s. Frames then miss their budget on a loaded
machine, as in real time.
"""

from __future__ import annotations

import contextlib
import re
import time

import anyio
import anyio.to_thread
import pytest
from test_dms_service import run

from aio_runtime import (
    Ledger,
    ModelTimeout,
    SignalTimeout,
    WorkerThread,
    now,
    run_in_thread,
    use_ledger,
    wait_until,
)
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms.backends.accelerator import MODEL_KERNEL
from pipelines.dms.backends.cpu import CpuBackend, OnnxRunner
from pipelines.dms.backends.sim import model_kernel, simulated_device
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.model.reference import reference_model_path
from pipelines.dms.model.warp import MODEL_INPUT_SIZE
from pipelines.dms.service import DmsService
from transports.gpu import SessionConfig
from transports.sim.usb import SimUsbTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

FRAMES = 60
HANG_START = 20
HANG_FRAMES = 6
MISSES = 3
"""Frames over budget, the hung one first, by the last of whose deadlines the hang must have made
the service UNAVAILABLE."""
GRACE = 0.005
"""Real seconds the loop waits before each jump: ``run_in_thread`` closes its ledger entry just
before its thread wakes the loop, and the clock must not jump in between."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # hold= is for asyncio's loop


def _layer(reason: str) -> str:
    """A reason is written ``"<layer>: <detail>"``."""
    return reason.split(": ", 1)[0]


@pytest.mark.parametrize(
    ("fault", "layer"),
    [("gpu-hang", "gpu-queue"), ("fence-stall", "gpu-queue"), ("usb-timeout", "usb-transfer")],
)
async def test_a_hung_accelerator_is_unavailable_within_its_deadline_in_virtual_time(fault, layer):
    camera = SyntheticCamera()
    period = camera.period_ns / 1e9
    config = ServiceConfig(
        device="sim",
        health_port=None,
        calib=(0.0, 0.0, 0.0),
        frames=FRAMES,
        faults=f"{fault}@{HANG_START}+{HANG_FRAMES}",
    )
    messages = []
    real_start = time.monotonic()
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)) as clock:
            start = clock.now()
            with anyio.fail_after(30):  # virtual seconds; the run takes FRAMES periods (3 s)
                async with DmsService(config, source=camera) as service:

                    async def collect():
                        async for message in service.messages(backlog=FRAMES):
                            messages.append(message)

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(collect)
                        await service.finished()
                        tg.cancel_scope.cancel()
            elapsed = clock.now() - start
    assert time.monotonic() - real_start < 60  # ~1.5 s here: 3 s of frames, no real waiting
    assert elapsed == pytest.approx(FRAMES * period, abs=period)

    # Every frame is accounted for: published valid, published invalid, or dropped and counted.
    frames = service.summary.frames
    frames.check()
    assert frames.received == FRAMES
    frame_messages = [m for m in messages if m.frame_id >= 0]  # and status messages (-1)
    assert len(frame_messages) == frames.valid + sum(frames.invalid.values())
    assert [m.seq for m in messages] == list(range(len(messages)))
    by_frame = {m.frame_id: m for m in frame_messages}

    # Before the hang every frame is valid, and on time: thread work took no virtual time.
    up = next(m for m in messages if m.availability == "available")
    before = [by_frame[f] for f in range(up.frame_id, HANG_START)]
    assert before and all(m.valid and m.availability == "available" for m in before)
    assert all(m.frame_age < config.budget and not m.late for m in before)

    # The hang starts at its frame: the first frame since the service came up that fails.
    hung = next(m for m in messages if m.frame_id > up.frame_id and not m.valid)
    assert hung.frame_id == HANG_START

    # UNAVAILABLE, naming the layer, no later than the deadline of the MISSES-th frame over budget
    # (hang start + (MISSES - 1) periods + budget): exact in virtual time, no slack.
    # The frame whose run found the hang may have ended stale before (its run went on): a status
    # message (no frame's) then says so at once.
    unavailable = next(m for m in messages if m.seq > hung.seq and m.availability == "unavailable")
    assert _layer(unavailable.reason) == layer, unavailable.reason
    assert "the accelerator has made no progress: hung" in unavailable.reason
    assert not unavailable.valid
    bound = hung.timestamp_sof / 1e9 + (MISSES - 1) * period + config.budget
    published = unavailable.log_mono_time / 1e9
    assert published <= bound + 1e-6, f"UNAVAILABLE {(published - bound) * 1e3:.3f} ms late"

    # Once the fault has cleared the session is restarted: from the first valid frame on, every
    # frame is valid (those before AVAILABLE too: validity is the frame's), and the service is
    # AVAILABLE again after recover_after of them, to the last.
    cleared = HANG_START + HANG_FRAMES
    back = next(m for m in messages if m.frame_id >= cleared and m.valid)
    assert all(not m.valid for m in messages if HANG_START <= m.frame_id < back.frame_id)
    after = [m for m in messages if m.seq >= back.seq]
    assert len(after) >= 3  # a USB link still timing out (1 s) delays the reopen the most
    assert all(m.valid for m in after)
    available = [m.availability == "available" for m in after]
    assert available.index(True) == config.recover_after - 1 and all(
        available[config.recover_after - 1 :]
    )
    assert after[-1].frame_id == FRAMES - 1
    assert service.availability.state.availability.value == "available"


async def test_work_on_threads_takes_no_virtual_time_while_the_clock_is_held():
    """A poll bounded by 10 ms waits for a word that a thread sets after 30 ms of real time, as the
    service polls the compute timeline while the model runs. The poll's backoff keeps short timers
    pending all along; held, the clock does not move on them while the thread works."""
    word: list[int] = []

    def block() -> str:
        time.sleep(0.03)  # a blocking call
        word.append(1)
        return "done"

    worker = WorkerThread("test")
    calls = {
        "anyio.to_thread": lambda: anyio.to_thread.run_sync(block),
        "run_in_thread": lambda: run_in_thread(
            block, awaited="a call", error=ModelTimeout, timeout=1
        ),
        "a WorkerThread": lambda: run_in_thread(
            block, awaited="a call", error=ModelTimeout, timeout=1, worker=worker
        ),
    }
    try:
        with use_ledger(Ledger()) as ledger, anyio.fail_after(10):
            async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
                for name, call in calls.items():
                    word.clear()
                    start = now()
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(call)
                        await wait_until(
                            lambda: len(word),
                            bool,
                            awaited=f"the word set on {name}",
                            error=SignalTimeout,
                            timeout=0.01,
                        )
                    assert now() - start < 0.01, name
    finally:
        worker.close()


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("gpu-hang", "HardwareTimeout: [gpu-queue] "),
        ("usb-timeout", "HardwareTimeout: [usb-transfer] "),
    ],
)
async def test_the_accelerator_is_restarted_for_the_typed_error_a_frame_met(fault, error):
    """The session fails with what the frame met, typed — here the accelerator's lack of
    progress, as a hardware timeout of the layer it stalled in — and its supervisor says so."""
    config = ServiceConfig(
        device="sim",
        health_port=None,
        calib=(0.0, 0.0, 0.0),
        frames=FRAMES,
        faults=f"{fault}@{HANG_START}+{HANG_FRAMES}",
    )
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            with anyio.fail_after(30):
                async with DmsService(config, source=SyntheticCamera()) as service:
                    await service.finished()
    failed = [t for _, t in service.summary.transitions if "attempt 1 failed" in t]
    assert failed and failed[0].startswith(f"unavailable(accelerator: {error}"), failed
    assert "the accelerator has made no progress: hung" in failed[0]


# -- late frames and a busy host: no false alarms --------------------------------------------


@pytest.fixture(scope="module")
def reference_model():
    """The bundled model on onnxruntime, loaded once: the simulated GPU's kernel runs it."""
    runner = OnnxRunner(reference_model_path())
    yield runner
    runner.close()


@contextlib.asynccontextmanager
async def accelerator(runner, kernel=None, duration=0.0):
    """A simulated accelerator of the test's own whose model kernel is ``kernel(model)`` (the
    model itself by default), taking ``duration`` seconds of simulated time: how to reach it."""
    size, length = MODEL_INPUT_SIZE, runner.contract.output_length
    async with simulated_device(runner.run_blocking, image_size=size, output_size=length) as sim:
        model = model_kernel(runner.run_blocking, size, length)
        sim.gpu.register_kernel(MODEL_KERNEL, model if kernel is None else kernel(model), duration)

        async def opener():
            return SimUsbTransport(sim.bridge)

        yield opener


async def serve(config, transport=None):
    """The service on the synthetic camera until it ends (within 30 s of the loop's clock):
    the service and its messages, every frame accounted for."""
    service, messages = await run(
        config, SyntheticCamera(), transport=transport, backlog=config.frames, within=30
    )
    service.summary.frames.check()
    return service, messages


async def run_service(config, transport=None):
    """:func:`serve` in virtual time, in which work on threads takes none."""
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            return await serve(config, transport)


def _after_up(messages):
    """The messages from the first AVAILABLE one on."""
    up = next(m for m in messages if m.availability == "available")
    return [m for m in messages if m.seq >= up.seq]


SIM = {"device": "sim", "health_port": None, "calib": (0.0, 0.0, 0.0), "frames": 40}


async def test_a_device_slower_than_the_frame_period_publishes_fewer_frames_all_valid(
    reference_model,
):
    """A device that takes 60 ms a frame (more than the budget and the frame period, far less
    than the hang bound): every run goes on past its deadline and its frame is published valid
    with its output, flagged late; a frame that could not be published within its staleness
    bound is not started (dropped, counted) — never stale, never a restart — and the service
    says it cannot keep up, with the rate it keeps."""
    config = ServiceConfig(**{**SIM, "frames": 80})  # the rate is judged over a 2 s window
    # The simulated device inside the ledger virtual time watches: its model kernel's thread
    # holds the clock (outside, the clock would jump on while the model runs on a busy machine).
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            async with accelerator(reference_model, duration=0.06) as transport:
                service, messages = await serve(config, transport)
    frames = service.summary.frames
    published = [m for m in messages if m.frame_id >= 0]
    assert published and all(m.valid and m.late for m in published)
    assert all(config.budget < m.frame_age <= config.staleness for m in published)
    assert frames.late == frames.valid == len(published) >= 55  # 3 of 4 frames at 16.7 Hz
    (counted,) = [
        sample.value
        for metric in service.metrics.frames_late.collect()
        for sample in metric.samples
        if sample.name == "dms_frames_late_total"
    ]
    assert counted == frames.late
    assert set(frames.dropped) == {"overload"} and frames.dropped["overload"] >= 5
    overloaded = [m for m in published if m.availability_reason_kind == "overloaded"]
    assert overloaded and re.match(
        r"overloaded: 1[45](\.5)? of 2[01] Hz valid", overloaded[-1].availability_reason
    )
    opened = [t for _, t in service.summary.transitions if "opening session" in t]
    assert len(opened) == 1, opened


async def test_a_host_not_scheduled_while_the_device_runs_is_not_a_hung_accelerator(
    reference_model,
):
    """The host is away for 0.12 s (more than the hang bound) while a frame's kernel runs (the
    clock jumps): the frames it could not take in time end stale or dropped, the accelerator is
    not judged hung nor restarted, and the service is never UNAVAILABLE once up."""
    config = ServiceConfig(**SIM)
    dispatched = []

    def away_once(model):
        async def kernel(gpu, *args):
            dispatched.append(now())
            if len(dispatched) == 20:
                clock.jump(0.12)  # the loop is not scheduled: every timer fires late
            await model(gpu, *args)

        return kernel

    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)) as clock:
            async with accelerator(reference_model, away_once) as transport:
                service, messages = await serve(config, transport)
    assert len(dispatched) >= 20
    after = _after_up(messages)
    assert not any(m.availability == "unavailable" for m in after)
    lost = [m for m in after if not m.valid]
    assert lost and all(m.reason.startswith("stale: ") for m in lost)
    assert len(lost) + sum(service.summary.frames.dropped.values()) <= 4  # the 0.12 s away
    opened = [t for _, t in service.summary.transitions if "opening session" in t]
    assert len(opened) == 1, opened
    assert not any("hung" in t for _, t in service.summary.transitions)


async def test_a_cpu_run_past_its_deadline_is_published_late_not_stopped(monkeypatch):
    """The CPU runner runs back to back; a run that takes longer than the budget (here a
    scripted 40 ms before it starts) is not stopped at the deadline: its frame is published
    valid with its output, flagged late."""
    slow = {10, 20, 30}
    calls = []
    infer = CpuBackend.infer

    async def slow_infer(self, image, calib):
        calls.append(now())
        if len(calls) in slow:
            await anyio.sleep(0.04)  # off the frames' 50 ms beat: no next frame comes meanwhile
        return await infer(self, image, calib)

    monkeypatch.setattr(CpuBackend, "infer", slow_infer)
    config = ServiceConfig(**{**SIM, "device": "cpu"})
    _, messages = await run_service(config)
    late = [m for m in messages if m.late]
    assert len(late) == len(slow)
    assert all(m.valid and m.frame_age > config.budget for m in late)
    assert not any(m.availability == "unavailable" for m in _after_up(messages))


# -- recovery: from the end of a fault to AVAILABLE ------------------------------------------------

RECOVERY = 1.0
"""Seconds from the end of a fault to AVAILABLE again, at most, on top of the hardware's own
mandatory pauses (a mode-1 reset, where the boot that recovers needs one)."""
MODE1_RESET = "SOC: mode-1 reset (firmware was running)"


class RecordedCamera:
    """The synthetic camera, noting as each frame reaches the service when it did (loop clock),
    and whether the model's device was then being reopened."""

    def __init__(self, service_of):
        self.camera = SyntheticCamera()
        self.service_of = service_of
        self.arrived: list[float] = []
        self.reopening: list[bool] = []

    def __aiter__(self):
        return self._frames()

    async def _frames(self):
        async for frame in self.camera:
            service = self.service_of()
            reason = service.availability.state.reason
            self.arrived.append(now())
            self.reopening.append(
                service.device.current is None
                and reason is not None
                and reason.detail.startswith("opening session")
            )
            yield frame


@pytest.mark.parametrize(
    ("faults", "during_reopen"),  # which fault (by index) strikes while a session reopens
    [
        ("gpu-hang@20+6", None),
        ("fence-stall@20+6", None),
        ("usb-timeout@20+6", None),
        ("usb-disconnect@20+6", None),
        ("gpu-hang@20+2,smu-timeout@21+10", None),  # the SMU is silent as the session reboots
        ("usb-timeout@20+6,smu-timeout@31+6", 1),
        ("usb-timeout@20+6,usb-timeout@33+4", 1),
        ("usb-timeout@20+6,usb-disconnect@32+4", 1),
        ("usb-timeout@20+6,gpu-hang@32+8", 1),
        ("usb-timeout@20+6,fence-stall@32+8", 1),
    ],
)
async def test_the_service_is_available_within_a_second_of_a_fault_ending(faults, during_reopen):
    """From the end of the last fault (its last frame has passed; a bridge that left the bus is
    back) to AVAILABLE: at most RECOVERY virtual seconds, plus 0.5 s where the boot that
    recovers needs a mode-1 reset — for every kind of accelerator fault, and for faults that
    strike while the session is being reopened (which must then be what they struck)."""
    config = ServiceConfig(
        device="sim", health_port=None, calib=(0.0, 0.0, 0.0), frames=FRAMES + 20, faults=faults
    )
    service = None
    camera = RecordedCamera(lambda: service)
    end = max(spec.start + spec.frames for spec in config.faults)
    recovered: list[tuple[float, list[str]]] = []
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)):
            with anyio.fail_after(30):
                service = DmsService(config, source=camera)
                async with service:

                    async def watch():
                        with service.transitions() as transitions:
                            async for t in transitions:
                                late = len(camera.arrived) > end
                                if late and t.current.availability.value == "available":
                                    session = service.device.current.backend.runner.session
                                    recovered.append((t.current.since, session.boot_log.steps))
                                    return

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(watch)
                        await service.finished()
                        tg.cancel_scope.cancel()
        ledger.assert_empty()  # abandoned attempts and sessions released everything they took
    service.summary.frames.check()
    if during_reopen is not None:
        spec = config.faults[during_reopen]
        assert camera.reopening[spec.start], f"{spec.name} did not strike during a reopen"
    assert recovered, "not AVAILABLE again after the faults ended"
    available_at, boot_steps = recovered[0]
    pause = SessionConfig().mode1_reset_pause if MODE1_RESET in boot_steps else 0.0
    took = available_at - camera.arrived[end]
    assert 0 <= took <= RECOVERY + pause + 1e-6, (
        f"AVAILABLE {took:.3f} s after the fault ended (allowed {RECOVERY} s + {pause} s)"
    )
