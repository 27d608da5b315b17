"""The DMS service end to end through its outside edges: the health endpoints queried over HTTP
while it runs (available, unavailable, recovered), and camera sources opened from a path (a
recording, a video file, one that cannot be opened)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.to_thread
import numpy as np
import pytest
from test_dms_camera import gray_images, write_video
from test_dms_endpoints import get
from test_dms_service import run

from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.recording import FrameRecorder
from pipelines.dms.frames.source import clock_ns
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.service import DmsService

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

LAYERS = ("deviceOnline", "firmwareReady", "queueSubmittable", "taskComplete", "outputValid")
PERIOD_NS = 50_000_000
READOUT_NS = 11_000_000  # the 1344x760 cabin camera's (os_fisheye)
CPU = {"device": "cpu", "calib": (0.0, 0.0, 0.0), "budget": 0.5}
"""The model on the CPU, a static calibration, a budget that no hiccup of a busy machine misses."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def until(stream, wanted: Callable[[str], bool]) -> str:
    """The next availability state (as text, e.g. ``unavailable(camera: ...)``) that is wanted."""
    async for transition in stream:
        if wanted(state := str(transition.current)):
            return state
    raise AssertionError("the service stopped reporting its availability")


async def fetch(service: DmsService, path: str) -> tuple[int, str]:
    return await anyio.to_thread.run_sync(get, f"http://127.0.0.1:{service.health_port}{path}")


async def ready(service: DmsService) -> tuple[int, dict, int, dict]:
    """``/v2/health/ready`` and ``/v2/models/dms/ready``: status and body of each."""
    status, body = await fetch(service, "/v2/health/ready")
    model_status, model_body = await fetch(service, "/v2/models/dms/ready")
    return status, json.loads(body), model_status, json.loads(model_body)


COUNTERS = (
    "dms_frames_in_total",
    'dms_frames_published_total{valid="true"}',
    'dms_frames_published_total{valid="false"}',
)


def counts(service: DmsService) -> tuple[int, int, int]:
    frames = service.summary.frames
    return frames.received, frames.valid, sum(frames.invalid.values())


async def scrape(service: DmsService) -> dict[str, float]:
    """``/metrics``, its frame counters checked against the service's own accounting read just
    before and just after: every frame counted shows, none that was not yet counted."""
    before = counts(service)
    status, text = await fetch(service, "/metrics")
    assert status == 200
    samples = {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in text.splitlines())
        if name and not name.startswith("#")
    }
    scraped = tuple(samples.get(name, 0.0) for name in COUNTERS)
    for low, value, high in zip(before, scraped, counts(service), strict=True):
        assert low <= value <= high, (before, scraped, counts(service))
    return samples


def gauge(samples: dict[str, float]) -> list[str]:
    states = ("available", "degraded", "unavailable")
    return [s for s in states if samples[f'dms_availability{{state="{s}"}}'] == 1.0]


async def stalling_camera(stall: anyio.Event, resume: anyio.Event):
    """Synthetic frames; once ``stall`` is set none, until ``resume`` is (then a fresh camera, so
    no backlog of frames arrives at once): a camera that stalls for as long as the test needs."""
    async with SyntheticCamera() as camera:
        async for frame in camera:
            if stall.is_set():
                break
            yield frame
    await resume.wait()
    async with SyntheticCamera() as camera:
        async for frame in camera:
            yield frame


async def test_health_over_http_while_available_while_the_camera_stalls_and_once_it_is_back():
    stall, resume = anyio.Event(), anyio.Event()
    config = ServiceConfig(health_port=0, **CPU)
    with anyio.fail_after(60):
        async with DmsService(config, source=stalling_camera(stall, resume)) as service:
            with service.transitions() as stream:
                await until(stream, lambda state: state == "available")
                # the server is started before the camera, so before any frame made it available
                assert service.health_port
                assert await fetch(service, "/v2/health/live") == (200, '{"live":true}')
                status, body, model_status, model_body = await ready(service)
                assert (status, model_status) == (200, 200)
                assert body == {
                    "ready": True,
                    "availability": "available",
                    "reason": None,
                    "readiness": dict.fromkeys(LAYERS, True),
                }
                assert model_body == {"name": "dms", **body}
                samples = await scrape(service)
                assert samples['dms_frames_published_total{valid="true"}'] >= 1
                assert gauge(samples) == ["available"]

                stall.set()
                await until(stream, lambda state: state.startswith("unavailable(camera"))
                status, body, model_status, model_body = await ready(service)
                assert (status, model_status) == (503, 503)
                assert body["ready"] is False and body["availability"] == "unavailable"
                assert body["reason"].startswith("camera: ") and "a camera frame" in body["reason"]
                assert body["readiness"]["deviceOnline"] is True  # the model is fine
                assert model_body == {"name": "dms", **body}
                assert (await fetch(service, "/v2/health/live"))[0] == 200  # alive all the same
                stalled = service.summary.frames.received
                samples = await scrape(service)
                assert samples["dms_frames_in_total"] == stalled  # nothing arrives while stalled
                assert gauge(samples) == ["unavailable"]

                resume.set()
                await until(stream, lambda state: state == "available")
                status, body, model_status, _ = await ready(service)
                assert (status, model_status) == (200, 200) and body["reason"] is None
                samples = await scrape(service)
                assert samples["dms_frames_in_total"] > stalled
                assert gauge(samples) == ["available"]


async def test_health_over_http_while_the_accelerator_hangs_and_after_it_recovers():
    # frames 20 to 79 hang: 3 s at 20 Hz (the queries made meanwhile take milliseconds); the
    # accelerator is reopened within half a second of the hang's end
    config = ServiceConfig(
        calib=(0.0, 0.0, 0.0), health_port=0, faults="gpu-hang@20+60", backoff_max=0.5
    )
    with anyio.fail_after(60):
        async with DmsService(config) as service:
            with service.transitions() as stream:
                # once frame 20 is in, nothing can make it available until the hang ends
                await until(
                    stream,
                    lambda state: (
                        state.startswith("unavailable") and service.summary.frames.received > 20
                    ),
                )
                status, body, model_status, model_body = await ready(service)
                hung = service.summary.frames.received
                assert hung < 80, "the hang ended before the service was queried"
                assert (status, model_status) == (503, 503)
                assert body["availability"] == "unavailable" and body["reason"]
                assert model_body["ready"] is False and model_body["reason"]
                samples = await scrape(service)
                assert gauge(samples) == ["unavailable"]
                assert samples['dms_frames_published_total{valid="false"}'] >= 1
                assert samples['dms_timeouts_total{layer="gpu-queue"}'] >= 1

                await until(stream, lambda state: state == "available")
                assert service.summary.frames.received > 80  # recovered once the hang ended
                status, body, _, _ = await ready(service)
                assert status == 200 and body["readiness"] == dict.fromkeys(LAYERS, True)


# --- camera sources opened from a path ------------------------------------------------------


def from_path(path: Path, frames: int | None = None) -> ServiceConfig:
    return ServiceConfig(camera=str(path), frames=frames, health_port=None, **CPU)


def of_frames(messages: list) -> list:
    """The messages for frames (not the status messages of a camera that is late: frame id -1)."""
    return [m for m in messages if m.frame_id >= 0]


def check_frames(service: DmsService, messages: list, received: int) -> list:
    """Every frame received is accounted for; the messages are published in order and, once the
    service is available, each is valid, with driver data. Returns the frames' messages."""
    frames = service.summary.frames
    frames.check()
    assert frames.received == received
    assert [m.seq for m in messages] == list(range(len(messages)))
    messages = of_frames(messages)
    assert len(messages) == frames.valid + sum(frames.invalid.values())
    first = next(k for k, m in enumerate(messages) if m.valid)
    assert all(m.valid and m.left_driver_data and m.right_driver_data for m in messages[first:])
    return messages


def cabin_recording(path: Path, ids: list[int], first_sof: int) -> dict[int, int]:
    """A recording of 1344x760 frames ``ids``, one period apart per id; returns each id's start
    of frame as recorded."""
    y = np.tile(np.linspace(30, 200, 1344, dtype=np.uint8), (760, 1))
    uv = np.full((380, 1344), 128, np.uint8)
    sofs = {i: first_sof + (i - ids[0]) * PERIOD_NS for i in ids}
    with FrameRecorder(path) as recorder:
        for i, sof in sofs.items():
            recorder.write(
                Frame.from_planes(
                    y, uv, frame_id=i, timestamp_sof=sof, timestamp_eof=sof + READOUT_NS
                )
            )
    return sofs


async def test_a_recording_is_replayed_through_the_service_with_its_ids_and_spacing(tmp_path):
    path = tmp_path / "cabin.dmsrec"
    recorded = cabin_recording(path, [3, 4, 6, 7, 8, 9, 10, 11, 12, 13], 1_700_000_000 * 10**9)
    started = clock_ns()
    service, messages = await run(from_path(path))  # the end of the recording ends the service
    ended = clock_ns()
    messages = check_frames(service, messages, len(recorded))
    ids = [m.frame_id for m in messages]  # as recorded, the gap at 5 included
    assert ids == sorted(ids) and set(ids) <= set(recorded) and ids[-1] == 13
    # re-timed onto the service's clock by one shift: the recorded spacing and readout are kept
    (shift,) = {m.timestamp_sof - recorded[m.frame_id] for m in messages}
    assert started <= recorded[3] + shift <= ended
    assert all(m.timestamp_eof - m.timestamp_sof == READOUT_NS for m in messages)
    # ... and the recorded timestamps are kept in the message, and in its JSON record
    assert all(m.recorded_sof == recorded[m.frame_id] for m in messages)
    assert all(m.recorded_eof == recorded[m.frame_id] + READOUT_NS for m in messages)
    record = messages[-1].to_record()
    assert record["recordedTimestampSof"] == recorded[13]


async def test_a_video_file_runs_through_the_service_up_to_the_frames_asked_for(tmp_path):
    path = tmp_path / "cabin.avi"
    images = [np.full((760, 1344, 3), 60 + 8 * k, np.uint8) for k in range(12)]
    write_video(path, images, fps=20)
    service, messages = await run(from_path(path, frames=8))
    messages = check_frames(service, messages, 8)
    assert {m.frame_id for m in messages} <= set(range(8)) and messages[-1].frame_id == 7
    assert len({m.timestamp_sof - m.frame_id * PERIOD_NS for m in messages}) == 1  # 20 Hz
    assert all(m.timestamp_eof - m.timestamp_sof == READOUT_NS for m in messages)
    # a video's frames were recorded at their index times its frame period
    assert messages[-1].recorded_sof == messages[-1].frame_id * PERIOD_NS


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b"DMSNV12\x00\x01", "ReplayFormatError: .*file header at byte 0: truncated"),
        (b"not a video" * 100, "VideoDecodeError: FFmpeg cannot open video file .*nothing"),
    ],
    ids=["truncated-recording", "not-a-video"],
)
async def test_a_camera_that_cannot_be_opened_is_reported_unavailable(tmp_path, content, error):
    path = tmp_path / "nothing"
    path.write_bytes(content)
    with anyio.fail_after(30):
        async with DmsService(from_path(path)) as service:
            with service.transitions() as stream:
                state = await until(stream, lambda state: state.startswith("unavailable(camera"))
                await service.finished()  # no camera: the service ends, it does not hang
    assert service.availability.state.availability.value == "unavailable"
    assert re.fullmatch(f"unavailable\\(camera: {error}.*\\)", state)
    assert service.summary.frames.received == 0
    assert service.summary.camera_error is not None


def test_a_camera_path_that_does_not_exist_is_refused_with_what_was_expected(tmp_path):
    with pytest.raises(ValueError, match="no such file \\(expected 'synthetic', a video file"):
        ServiceConfig(camera=str(tmp_path / "nothing")).check_environment()


async def test_a_video_of_no_cabin_cameras_size_is_published_invalid_with_the_reason(tmp_path):
    write_video(path := tmp_path / "small.avi", gray_images(14), fps=20)  # 64x48
    service, messages = await run(from_path(path))
    frames, messages = service.summary.frames, of_frames(messages)
    frames.check()
    assert frames.received == 14 and len(messages) >= 10
    assert not any(m.valid or m.left_driver_data for m in messages)
    assert all("no cabin camera intrinsics for a 64x48 frame" in m.reason for m in messages)
    assert messages[-1].availability == "unavailable"  # not degraded forever
    # one lasting cause: a few kinds of reason and transitions, not one of each per frame
    assert len(frames.invalid) <= 3 and len(service.summary.transitions) <= 4


async def test_sinks_opened_before_one_that_fails_are_closed_and_their_address_is_free(tmp_path):
    """The ZeroMQ sink binds, then the JSON lines file cannot be opened (a FIFO that no one
    reads): the start fails, the ZeroMQ sink is closed, and its address is free again (a retry
    in the same process binds it)."""
    from pipelines.dms.service import StartupError
    from pipelines.dms.sinks.zmq import ZmqSink

    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    chosen = ZmqSink("tcp://127.0.0.1:0")  # a port of this process's own, for the test
    address = chosen.address
    chosen.close(timeout=0)
    service = DmsService(ServiceConfig(zmq=address, jsonl=str(fifo), health_port=None, **CPU))
    with anyio.fail_after(30):
        with pytest.raises(StartupError, match="a FIFO that no one reads") as refused:
            async with service:
                pass
    assert refused.value.setting == "jsonl"
    again = ZmqSink(address)  # AddressInUse while the first sink's socket is bound
    again.close(timeout=0)
    assert f"zmq {address}" in [sink.name for sink in service.summary.sinks]  # its counts
