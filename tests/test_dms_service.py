"""The DMS service end to end: frame accounting, faults to UNAVAILABLE and back (the accelerator hang
in virtual time: test_dms_service_virtual_time.py), geometry changes,
calibration, health."""

from __future__ import annotations

import dataclasses
import os
import re

import anyio
import pytest

from aio_runtime import Ledger, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.service import DmsService

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

CPU = {"device": "cpu", "health_port": None, "calib": (0.0, 0.0, 0.0), "budget": 0.5}
"""The model on the CPU, a static calibration, a budget no hiccup of a loaded machine misses: for
tests whose subject is not the budget."""


async def run_until(config: ServiceConfig, done, *, service=None, within: float = 60) -> list:
    """The messages the service (``service``, or one of ``config``) published, up to and with the
    first for which ``done(message)`` is true: however slow the host, the service runs until it
    has said that (a bound of ``within`` seconds of the loop's clock)."""
    messages = []
    with anyio.fail_after(within):
        async with service or DmsService(config) as running:
            async for message in running.messages(backlog=1000):
                messages.append(message)
                if done(message):
                    return messages
    raise AssertionError(f"the service ended before it said so: {messages[-3:]}")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def run(
    config: ServiceConfig, source=None, *, transport=None, backlog: int = 1000, within: float = 60
) -> tuple[DmsService, list]:
    """The service (on ``source``, or the config's camera; ``transport``: its accelerator's) until
    it ends, within ``within`` seconds of the loop's clock: the service and every message it
    published (``backlog``: how many may wait unread)."""
    messages = []
    with anyio.fail_after(within):
        async with DmsService(config, source=source, transport=transport) as service:

            async def collect():
                async for message in service.messages(backlog=backlog):
                    messages.append(message)

            async with anyio.create_task_group() as tg:
                tg.start_soon(collect)
                await service.finished()
                tg.cancel_scope.cancel()
    return service, messages


async def test_every_frame_ends_exactly_once_even_when_frames_are_dropped():
    config = ServiceConfig(device="cpu", health_port=None, calib=(0.0, 0.0, 0.0), budget=0.2)
    source = SyntheticCamera(fps=400, frames=120)  # far faster than warp + model
    service, messages = await run(config, source)
    frames = service.summary.frames
    frames.check()  # received == valid + invalid + dropped
    assert frames.received == 120
    assert sum(frames.dropped.values()) > 0  # latest frame wins
    assert len(messages) == frames.valid + sum(frames.invalid.values())
    assert [m.seq for m in messages] == list(range(len(messages)))


async def test_a_resolution_change_mid_stream_is_warped_with_the_new_geometry():
    config = ServiceConfig(**CPU, frames=30)
    source = SyntheticCamera(frames=30, switch_at=15)
    # In virtual time, held while the warp and the model work on their threads: no frame is late or
    # dropped however slow the host (the subject is the geometry, not the host's speed).
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=0.005, hold=threads_busy(ledger)):
            service, messages = await run(config, source)
    service.summary.frames.check()
    assert {m.frame_id for m in messages if m.valid} >= set(range(16, 30))


async def test_a_stale_frame_is_published_invalid_not_processed():
    async def source():
        async with SyntheticCamera(frames=30) as camera:
            async for frame in camera:
                if frame.frame_id in (10, 11):  # delivered 1 s after its start of frame
                    shift = 1_000_000_000
                    frame = dataclasses.replace(
                        frame,
                        timestamp_sof=frame.timestamp_sof - shift,
                        timestamp_eof=frame.timestamp_eof - shift,
                    )
                yield frame

    config = ServiceConfig(**CPU)
    service, messages = await run(config, source())
    service.summary.frames.check()
    by_frame = {m.frame_id: m for m in messages}
    for stale in (10, 11):
        message = by_frame[stale]
        assert not message.valid and message.left_driver_data is None
        assert re.fullmatch(
            r"stale: the frame was 1\d\d\d\.\d ms old when it could be warped "
            r"\(stale after 500 ms\)",
            message.reason,
        )
    # two stale frames are no outage and no failure: the frames around them are valid
    assert all(m.availability != "unavailable" for m in by_frame.values() if m.frame_id > 5)
    after = [by_frame[f] for f in range(12, 30) if f in by_frame]  # live: a loaded host drops some
    assert after and all(m.valid for m in after)
    assert service.summary.frames.invalid["stale"] == 2


async def test_stale_or_non_finite_calibration_degrades_the_output():
    with pytest.raises(ValueError, match="3 finite numbers"):
        ServiceConfig(calib=(float("nan"), 0.0, 0.0))
    # the synthetic calibration stream is 4 Hz: with a 1 ms staleness limit it is always stale
    config = ServiceConfig(**{**CPU, "calib": None}, calib_stale_after=1e-3)
    messages = await run_until(config, lambda m: m.frame_id >= 0 and "calibration" in m.reason)
    assert messages and all(not m.valid for m in messages)
    assert all(m.availability != "available" for m in messages)


async def test_health_reports_unavailable_while_the_camera_is_stalled():
    config = ServiceConfig(**CPU, frames=60, faults="camera-stall@20+12")
    states = []
    messages = []
    with anyio.fail_after(60):
        async with DmsService(config) as service:

            async def watch():
                with service.transitions() as stream:
                    async for transition in stream:
                        states.append((str(transition.current), service.health().ready))

            async def collect():
                async for message in service.messages(backlog=1000):
                    messages.append(message)

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                tg.start_soon(collect)
                await service.finished()
                tg.cancel_scope.cancel()
    stalled = [ready for state, ready in states if state.startswith("unavailable(camera")]
    assert stalled and not any(stalled)
    final, ready = states[
        -1
    ]  # back once the camera is (degraded, where a loaded host falls behind)
    assert ready and (final == "available" or final.startswith("degraded(overloaded"))
    # Every sink hears of the stall while it lasts (12 frames = 0.6 s; one status message per
    # 0.25 s stall period), not silence: status messages for no frame.
    status = [m for m in messages if m.frame_id == -1]
    assert status, "a stall must be published, not silence"
    assert all(not m.valid and m.availability == "unavailable" for m in status)
    assert all(m.reason.startswith("camera: ") and m.frame_age >= 0.25 for m in status)
    assert [m.seq for m in messages] == list(range(len(messages)))
    service.summary.frames.check()  # status messages are not frames


async def test_an_accelerator_that_is_slow_but_progressing_is_not_restarted():
    # A budget every frame overruns (the kernel finishes a few ms after the deadline): late
    # frames, published valid with their outputs and flagged late — no hang, no restart.
    config = ServiceConfig(
        device="sim",
        health_port=None,
        calib=(0.0, 0.0, 0.0),
        frames=30,
        budget=0.01,
        stale_after=0.5,  # a loaded machine's hiccup is not what this is about
        gpu_hang_after=0.5,
    )
    service, messages = await run(config)
    service.summary.frames.check()
    late = [m for m in messages if m.late]
    assert len(late) >= 15  # most frames overran
    assert all(m.valid and m.frame_age > config.budget for m in late)
    assert service.summary.frames.late == len(late)
    assert not any("gpu-queue" in m.reason or "restarting" in m.reason for m in messages)
    opened = [t for _, t in service.summary.transitions if "opening session" in t]
    assert len(opened) == 1, opened


async def test_output_that_is_never_valid_is_unavailable_not_degraded_forever():
    config = ServiceConfig(**CPU, frames=50, faults="nan-output@10+30")
    service, messages = await run(config)
    service.summary.frames.check()
    nan = [m for m in messages if 10 <= m.frame_id < 40]
    unavailable = [m for m in nan if m.availability == "unavailable"]
    assert unavailable and all(m.reason.startswith("no valid output: ") for m in unavailable)
    # the 10th frame in a row published without output, at the latest (live, a loaded host drops
    # some of the frames between)
    assert nan.index(unavailable[0]) <= config.unavailable_after - 1
    first = unavailable[0].frame_id
    before = [m for m in nan if m.frame_id < first]
    assert all(
        m.availability == "degraded" and m.reason.startswith("invalid output: ") for m in before
    )
    assert not service.health().ready or messages[-1].frame_id >= 45
    # A lasting fault is one transition per kind, not one per frame; the summary counts by kind.
    reasons = [t for _, t in service.summary.transitions]
    assert sum("no valid output" in t for t in reasons) == 1, reasons
    assert set(service.summary.frames.invalid) <= {
        "model unavailable",  # frames before the model is loaded
        "invalid output",
        "no valid output",
        "recovering",
    }


async def test_frames_in_flight_when_the_service_is_stopped_are_counted_as_dropped():
    config = ServiceConfig(device="cpu", health_port=None, calib=(0.0, 0.0, 0.0))
    for delay in (0.6, 0.65, 0.7):
        with anyio.fail_after(30):
            async with DmsService(config, source=SyntheticCamera(fps=100)) as service:
                await anyio.sleep(delay)  # stop mid-stream, wherever the frames are
        frames = service.summary.frames
        frames.check()  # every frame received is published or dropped
        assert frames.received > 0


async def test_a_non_finite_calibration_sample_is_rejected_and_named():
    from pipelines.dms.frames.synthetic import SyntheticCalibration

    config = ServiceConfig(**{**CPU, "calib": None}, calib_stale_after=0.2)
    calibration = SyntheticCalibration(rate=20.0, nan_at=range(3, 1000))  # NaN from sample 3 on
    ran = []  # the model ran: its task complete while the service was up

    def rejected(message) -> bool:
        ran.append(service.health().readiness["taskComplete"])
        return message.frame_id >= 20 and "calibration rejected" in message.reason

    service = DmsService(config, calibration=calibration)
    messages = await run_until(config, rejected, service=service)
    late = [m for m in messages if m.frame_id >= 20]
    assert late and all(not m.valid for m in late)
    assert any(ran)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
async def test_the_model_can_have_cpus_of_its_own_and_the_loop_gets_its_cpus_back():
    before = os.sched_getaffinity(0)
    model_cpu = max(before)
    inside = []

    async def source():
        async with SyntheticCamera(frames=12) as camera:
            async for frame in camera:
                inside.append(os.sched_getaffinity(0))  # on the loop's thread
                yield frame

    service, messages = await run(ServiceConfig(**CPU, model_cpus=(model_cpu,)), source())
    service.summary.frames.check()
    assert any(m.valid for m in messages)
    assert inside and all(model_cpu not in cpus for cpus in inside)  # the loop keeps off it
    assert os.sched_getaffinity(0) == before


def test_model_cpus_are_checked_against_the_cpus_there_are():
    available = sorted(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="model_cpus must be some of the CPUs"):
        ServiceConfig(model_cpus=(max(available) + 1,)).check_environment()
    with pytest.raises(ValueError, match="leaves no CPU for the event loop"):
        ServiceConfig(model_cpus=tuple(available)).check_environment()


async def test_an_accelerator_that_cannot_be_opened_does_not_hold_the_frames_back(monkeypatch):
    from aio_runtime import FirmwareTimeout
    from pipelines.dms.backends.accelerator import AcceleratorRunner

    async def never_opens(*args, **kwargs):
        raise FirmwareTimeout("SMU mailbox: no answer", awaited="the SMU")

    monkeypatch.setattr(AcceleratorRunner, "open", never_opens)
    config = ServiceConfig(
        device="sim", health_port=None, calib=(0.0, 0.0, 0.0), frames=10, model_load_timeout=30
    )
    with anyio.fail_after(60):
        async with DmsService(config) as service:
            started = anyio.current_time()
            message = await anext(aiter(service.messages()))
    # not after the 30 s the service would wait for a model that comes up slowly: frames flow
    # as soon as opening the accelerator failed, and say why there is no output
    assert anyio.current_time() - started < 5
    assert not message.valid and message.reason.startswith("model unavailable: ")
