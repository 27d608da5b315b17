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

import time

import anyio
import anyio.to_thread
import pytest

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
from pipelines.dms.camera_synthetic import SyntheticCamera
from pipelines.dms.config import ServiceConfig
from pipelines.dms.service import DmsService

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


def _published(message) -> float:
    """When a message was published, on the loop clock (its start of frame plus its age)."""
    return message.timestamp_sof / 1e9 + message.frame_age


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
    assert len(messages) == frames.valid + sum(frames.invalid.values())
    assert [m.seq for m in messages] == list(range(len(messages)))
    by_frame = {m.frame_id: m for m in messages}

    # Before the hang every frame is valid, and on time: thread work took no virtual time.
    up = next(m for m in messages if m.valid)
    before = [by_frame[f] for f in range(up.frame_id, HANG_START)]
    assert before and all(m.valid and m.availability == "available" for m in before)
    assert all(m.frame_age < config.budget for m in before)

    # The hang starts at its frame: the first frame since the service came up that fails.
    hung = next(m for m in messages if m.frame_id > up.frame_id and not m.valid)
    assert hung.frame_id == HANG_START

    # UNAVAILABLE, naming the layer, no later than the deadline of the MISSES-th frame over budget
    # (hang start + (MISSES - 1) periods + budget): exact in virtual time, no slack.
    unavailable = next(
        m for m in messages if m.frame_id >= HANG_START and m.availability == "unavailable"
    )
    assert _layer(unavailable.reason) == layer, unavailable.reason
    assert not unavailable.valid
    bound = hung.timestamp_sof / 1e9 + (MISSES - 1) * period + config.budget
    assert _published(unavailable) <= bound + 1e-6, (
        f"UNAVAILABLE {(_published(unavailable) - bound) * 1e3:.3f} ms after the bound"
    )

    # Once the fault has cleared the session is restarted and the service is AVAILABLE again: from
    # the first valid frame on, every frame is valid, to the last.
    cleared = HANG_START + HANG_FRAMES
    back = next(m for m in messages if m.frame_id >= cleared and m.valid)
    assert all(not m.valid for m in messages if HANG_START <= m.frame_id < back.frame_id)
    after = [m for m in messages if m.seq >= back.seq]
    assert len(after) >= 3  # a USB link still timing out (1 s) delays the reopen the most
    assert all(m.valid and m.availability == "available" for m in after)
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
