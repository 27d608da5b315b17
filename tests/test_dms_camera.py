"""Cabin camera frames and sources: NV12 layout, geometry checks, synthetic / video / replay sources.

Clock-paced sources run under virtual time (deterministic, instant). Sources that work on worker
threads (video decoding, recording, replay) run in real time at a high frame rate, because virtual
time does not wait for threads.
"""

from __future__ import annotations

import itertools
import math
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import cv2
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from recordings_v1 import write_v1

from aio_runtime import CameraTimeout, Ledger, now, wait_until
from aio_runtime.testing import virtual_time
from pipelines.dms.frames.frame import (
    AR_OX_FISHEYE,
    CABIN_CAMERAS,
    OS_FISHEYE,
    Frame,
    FrameError,
    FrameGeometryError,
    UnknownCameraError,
    camera_by_name,
    camera_for_resolution,
    nv12_layout,
    other_camera,
)
from pipelines.dms.frames.recording import (
    FILE_HEADER,
    RECORD_HEADER_V1,
    FrameRecorder,
    ReplayFormatError,
    record_frames,
)
from pipelines.dms.frames.recording_reader import RecordingReader
from pipelines.dms.frames.replay import ReplayCamera
from pipelines.dms.frames.source import FrameSource, clock_ns
from pipelines.dms.frames.synthetic import SyntheticCalibration, SyntheticCamera
from pipelines.dms.frames.video import VideoDecodeError, VideoFileCamera

pytestmark = pytest.mark.anyio

PERIOD_NS = 50_000_000


async def take(source: AsyncIterator[Frame], count: int) -> list[Frame]:
    return [await anext(source) for _ in range(count)]


async def opened(camera: SyntheticCamera) -> SyntheticCamera:
    """The camera with its scenes built (on a worker thread, in real time: a test then enters
    virtual time, which a thread's work does not hold back)."""
    await camera.open()
    return camera


async def workers_returned(ledger: Ledger) -> None:
    """Every worker thread a source started has returned (a worker leaves the ledger just after
    handing over its result, so this is awaited rather than asserted at once)."""
    await wait_until(
        ledger.live, lambda live: not live, awaited="worker threads", error=CameraTimeout, timeout=5
    )


# --- NV12 layout ----------------------------------------------------------------------------


def test_nv12_layout_of_the_1928x1208_camera_is_camerads():
    layout = nv12_layout(1928, 1208)
    assert (layout.stride, layout.y_height, layout.uv_height) == (2048, 1216, 608)
    assert (layout.uv_offset, layout.y_size, layout.size) == (2_490_368, 2_490_368, 4_804_608)


def test_nv12_layout_of_the_1344x760_camera_is_camerads():
    layout = nv12_layout(1344, 760)
    assert (layout.stride, layout.y_height, layout.uv_height) == (1408, 768, 384)
    assert (layout.uv_offset, layout.size) == (1_081_344, 2_428_928)


def _align(v: int, a: int) -> int:
    return (v + a - 1) // a * a


@given(st.integers(1, 2500), st.integers(1, 2000))
def test_nv12_layout_follows_the_general_rule(half_width, half_height):
    width, height = 2 * half_width, 2 * half_height
    layout = nv12_layout(width, height)
    stride, y_height, uv_height = _align(width, 128), _align(height, 32), _align(height // 2, 16)
    size = stride * y_height + stride * uv_height + 4096 + max(16384, 8 * stride)
    size = _align(_align(size, 4096) + _align(width, 512) * 512, 4096)
    assert (layout.stride, layout.y_height, layout.uv_height) == (stride, y_height, uv_height)
    assert layout.uv_offset == stride * y_height and layout.uv_offset % 4096 == 0
    assert layout.size == size
    assert layout.size >= layout.uv_offset + stride * (height // 2)


@pytest.mark.parametrize(("width", "height"), [(1927, 1208), (1928, 1207), (0, 760), (-2, 4)])
def test_nv12_layout_refuses_odd_or_empty_dimensions(width, height):
    with pytest.raises(FrameGeometryError, match=rf"even width and height.*got {width}x{height}"):
        nv12_layout(width, height)


# --- the cabin cameras ----------------------------------------------------------------------


def test_the_two_cabin_cameras_are_the_specs():
    assert AR_OX_FISHEYE.name == "ar_ox_fisheye" and AR_OX_FISHEYE.size == (1928, 1208)
    assert AR_OX_FISHEYE.focal == 567.0 and AR_OX_FISHEYE.readout_ns == 14_697_000
    assert OS_FISHEYE.name == "os_fisheye" and OS_FISHEYE.size == (1344, 760)
    assert OS_FISHEYE.focal == 425.25 and OS_FISHEYE.readout_ns == 11_000_000
    assert all(c.fps == 20.0 and c.period_ns == PERIOD_NS for c in CABIN_CAMERAS)
    np.testing.assert_array_equal(
        AR_OX_FISHEYE.intrinsics, [[567.0, 0, 964.0], [0, 567.0, 604.0], [0, 0, 1]]
    )
    np.testing.assert_array_equal(
        OS_FISHEYE.intrinsics, [[425.25, 0, 672.0], [0, 425.25, 380.0], [0, 0, 1]]
    )
    assert AR_OX_FISHEYE.layout.size == 4_804_608


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ar_ox_fisheye", AR_OX_FISHEYE),
        ("OX03C10", AR_OX_FISHEYE),
        ("ar0231", AR_OX_FISHEYE),
        ("tizi", AR_OX_FISHEYE),
        ("os_fisheye", OS_FISHEYE),
        ("os04c10", OS_FISHEYE),
        ("mici", OS_FISHEYE),
    ],
)
def test_a_camera_is_found_by_name_sensor_or_device(name, expected):
    assert camera_by_name(name) is expected


def test_a_camera_is_found_by_resolution_and_the_other_one_is_the_switch_target():
    assert camera_for_resolution(1928, 1208) is AR_OX_FISHEYE
    assert camera_for_resolution(1344, 760) is OS_FISHEYE
    assert other_camera(AR_OX_FISHEYE) is OS_FISHEYE and other_camera(OS_FISHEYE) is AR_OX_FISHEYE


def test_unknown_cameras_are_refused_with_the_known_ones():
    with pytest.raises(UnknownCameraError, match=r"'webcam'.*ar_ox_fisheye.*os_fisheye"):
        camera_by_name("webcam")
    with pytest.raises(UnknownCameraError, match=r"1280x720.*1928x1208.*1344x760"):
        camera_for_resolution(1280, 720)


# --- frames ---------------------------------------------------------------------------------


def blank(width: int = 1928, height: int = 1208, **overrides: object) -> Frame:
    layout = nv12_layout(width + width % 2, height + height % 2)  # odd sizes: a buffer anyway
    fields: dict[str, object] = {
        "buffer": np.zeros(layout.size, dtype=np.uint8),
        "width": width,
        "height": height,
        "stride": layout.stride,
        "frame_id": 7,
        "timestamp_sof": 1_000,
        "timestamp_eof": 2_000,
    }
    fields.update(overrides)
    return Frame(**fields)  # type: ignore[arg-type]


def test_plane_views_honour_the_stride_and_write_through():
    frame = blank()
    assert frame.y.shape == (1208, 1928) and frame.y.strides == (2048, 1)
    assert frame.uv.shape == (604, 1928) and frame.uv.strides == (2048, 1)
    frame.y[3, 5] = 200
    frame.uv[2, 1] = 99  # V of the chroma pair at column 0
    assert frame.buffer[3 * 2048 + 5] == 200
    assert frame.buffer[2_490_368 + 2 * 2048 + 1] == 99


def test_a_frame_built_from_planes_has_camerads_layout_with_zero_padding():
    rng = np.random.default_rng(1)
    y = rng.integers(0, 256, (760, 1344), dtype=np.uint8)
    uv = rng.integers(0, 256, (380, 1344), dtype=np.uint8)
    frame = Frame.from_planes(y, uv, frame_id=3, timestamp_sof=10, timestamp_eof=20)
    assert (frame.width, frame.height, frame.stride, frame.buffer.size) == (
        1344,
        760,
        1408,
        2_428_928,
    )
    np.testing.assert_array_equal(frame.y, y)
    np.testing.assert_array_equal(frame.uv, uv)
    rows = frame.buffer[: 760 * 1408].reshape(760, 1408)
    assert not rows[:, 1344:].any()  # row padding
    assert not frame.buffer[760 * 1408 : 1_081_344].any()  # Y alignment rows
    assert not frame.buffer[1_081_344 + 380 * 1408 :].any()  # after the chroma


def test_a_buffer_of_the_wrong_size_is_rejected_with_the_expected_size():
    with pytest.raises(
        FrameGeometryError, match=r"frame 7 \(1928x1208\).*expected 4804608, got 1000"
    ):
        blank(buffer=np.zeros(1000, dtype=np.uint8))


def test_a_buffer_sized_for_the_other_camera_is_rejected():
    with pytest.raises(FrameGeometryError) as info:
        blank(buffer=np.zeros(OS_FISHEYE.layout.size, dtype=np.uint8))
    assert (info.value.expected, info.value.observed) == (4_804_608, 2_428_928)


def test_a_stride_that_is_not_the_layouts_is_rejected():
    with pytest.raises(
        FrameGeometryError, match=r"stride 1928 .* width 1928: expected 2048"
    ) as info:
        blank(stride=1928)
    assert (info.value.expected, info.value.observed) == (2048, 1928)


def test_odd_dimensions_are_rejected():
    with pytest.raises(
        FrameGeometryError, match=r"frame 7: NV12 needs positive, even .* 1927x1208"
    ):
        blank(width=1927)


def test_a_buffer_of_the_wrong_dtype_or_shape_is_rejected():
    with pytest.raises(FrameGeometryError, match=r"must be uint8: expected uint8, got float32"):
        blank(buffer=np.zeros(4_804_608, dtype=np.float32))
    with pytest.raises(FrameGeometryError, match=r"must be flat \(1-D\).*got \(2, 2402304\)"):
        blank(buffer=np.zeros((2, 2_402_304), dtype=np.uint8))
    with pytest.raises(FrameGeometryError, match=r"must be a numpy array.*got bytes"):
        blank(buffer=bytes(4_804_608))
    with pytest.raises(FrameGeometryError, match="contiguous"):
        blank(buffer=np.zeros(2 * 4_804_608, dtype=np.uint8)[::2])


def test_bad_ids_and_timestamps_are_rejected():
    with pytest.raises(FrameError, match="count up from 0, got -1"):
        blank(frame_id=-1)
    with pytest.raises(FrameError, match=r"end of frame \(5 ns\) is before its start \(9 ns\)"):
        blank(timestamp_sof=9, timestamp_eof=5)
    with pytest.raises(FrameError, match="timestamp_sof must be an integer, got float"):
        blank(timestamp_sof=1.5)


def test_a_retimed_frame_keeps_its_buffer_and_its_recorded_timestamps():
    frame = blank()
    moved = frame.retimed(5_000, 6_500)
    assert moved.buffer is frame.buffer and moved.frame_id == 7
    assert (moved.timestamp_sof, moved.timestamp_eof) == (5_000, 6_500)
    assert (moved.recorded_sof, moved.recorded_eof) == (1_000, 2_000)
    assert moved.retimed(9_000, 9_100).recorded_sof == 1_000


# --- the synthetic camera -------------------------------------------------------------------


async def test_synthetic_frames_have_camerads_ids_and_timestamps_and_arrive_at_end_of_frame():
    camera = SyntheticCamera()
    assert isinstance(camera, FrameSource)
    with anyio.fail_after(30):
        await camera.open()  # its scene, built on a worker thread: in real time
        async with virtual_time(), camera:
            start = clock_ns()
            frames, arrivals = [], []
            for _ in range(10):
                frames.append(await anext(camera))
                arrivals.append(now())
    assert [f.frame_id for f in frames] == list(range(10))
    assert frames[0].timestamp_sof == start
    assert [b.timestamp_sof - a.timestamp_sof for a, b in itertools.pairwise(frames)] == [
        PERIOD_NS
    ] * 9
    assert all(f.timestamp_eof - f.timestamp_sof == 14_697_000 for f in frames)
    assert arrivals == pytest.approx([f.timestamp_eof / 1e9 for f in frames], abs=1e-6)
    assert all(
        (f.width, f.height, f.stride, f.buffer.size) == (1928, 1208, 2048, 4_804_608)
        for f in frames
    )


async def test_synthetic_timing_is_the_same_on_every_run():
    async def offsets() -> list[int]:
        camera = await opened(SyntheticCamera(jitter=0.002, seed=3, drop={4}))
        async with virtual_time():
            frames = await take(camera, 12)
        return [f.timestamp_sof - frames[0].timestamp_sof for f in frames]

    with anyio.fail_after(30):
        assert await offsets() == await offsets()


async def test_the_synthetic_scene_moves_and_stays_in_video_range():
    with anyio.fail_after(30):
        camera = await opened(SyntheticCamera())
        async with virtual_time():
            first, second = await take(camera, 2)
    assert first.buffer is not second.buffer
    assert np.mean(first.y != second.y) > 0.1
    for frame in (first, second):
        assert 16 <= frame.y.min() and frame.y.max() <= 235
        assert frame.y.std() > 10  # a scene, not a flat field
        assert set(np.unique(frame.uv[:, 0::2])) == {118} and set(np.unique(frame.uv[:, 1::2])) == {
            140
        }


async def test_frames_ends_the_stream_and_aclose_ends_it_early():
    with anyio.fail_after(30):
        three, camera = await opened(SyntheticCamera(frames=3)), await opened(SyntheticCamera())
        async with virtual_time():
            assert len([f async for f in three]) == 3
            await anext(camera)
            await camera.aclose()
            assert camera.closed
            with pytest.raises(StopAsyncIteration):
                await anext(camera)


async def test_a_consumer_that_gives_up_waiting_loses_no_frame():
    camera = SyntheticCamera()
    with anyio.fail_after(30):
        await camera.open()
        async with virtual_time():
            first = await anext(camera)
            with anyio.move_on_after(0.010):  # frame 1 is due 50 ms after frame 0
                await anext(camera)
                pytest.fail("frame 1 arrived before its end of frame")
            second = await anext(camera)
    assert (first.frame_id, second.frame_id) == (0, 1)
    assert second.timestamp_sof - first.timestamp_sof == PERIOD_NS


async def test_dropped_frames_skip_their_ids_and_their_periods():
    camera = SyntheticCamera(drop={2, 3, 7}, frames=6)
    with anyio.fail_after(30):
        await camera.open()
        async with virtual_time():
            frames = [f async for f in camera]
    assert [f.frame_id for f in frames] == [0, 1, 4, 5, 6, 8]
    base = frames[0].timestamp_sof
    assert [(f.timestamp_sof - base) // PERIOD_NS for f in frames] == [0, 1, 4, 5, 6, 8]
    assert camera.dropped == 3 and camera.delivered == 6


async def test_jitter_stays_within_its_bound_and_frames_stay_in_order():
    jitter = 0.003
    with anyio.fail_after(60):
        camera = await opened(SyntheticCamera(jitter=jitter, seed=11))
        async with virtual_time():
            start = clock_ns()
            frames = await take(camera, 200)
    deviations = [f.timestamp_sof - (start + f.frame_id * PERIOD_NS) for f in frames]
    assert max(abs(d) for d in deviations) <= jitter * 1e9
    assert max(abs(d) for d in deviations) > jitter * 1e9 / 2  # it does jitter
    sofs = [f.timestamp_sof for f in frames]
    assert sofs == sorted(sofs)


def test_jitter_of_half_a_period_or_more_is_refused():
    with pytest.raises(ValueError, match="under half a period"):
        SyntheticCamera(jitter=0.025)
    with pytest.raises(ValueError, match="positive, finite rate"):
        SyntheticCamera(fps=0)


async def test_a_resolution_change_switches_to_the_other_cameras_geometry_and_readout():
    with anyio.fail_after(30):
        camera = await opened(SyntheticCamera(switch_at=3))
        async with virtual_time():
            frames = await take(camera, 6)
    assert [f.size for f in frames] == [(1928, 1208)] * 3 + [(1344, 760)] * 3
    assert [f.buffer.size for f in frames[2:4]] == [4_804_608, 2_428_928]
    assert frames[3].stride == 1408
    assert frames[3].timestamp_eof - frames[3].timestamp_sof == 11_000_000
    assert frames[3].timestamp_sof - frames[2].timestamp_sof == PERIOD_NS  # the clock goes on


async def test_the_os_camera_can_be_the_starting_geometry():
    with anyio.fail_after(30):
        camera = await opened(SyntheticCamera("os_fisheye"))
        async with virtual_time():
            (frame,) = await take(camera, 1)
    assert frame.size == (1344, 760) and frame.y.shape == (760, 1344)


# --- the synthetic calibration stream -------------------------------------------------------


async def test_calibration_is_published_at_4_hz_with_timestamps():
    stream = SyntheticCalibration((0.01, -0.02, 0.03), count=5)
    with anyio.fail_after(30):
        async with virtual_time():
            start = clock_ns()
            samples = [s async for s in stream]
    assert [s.seq for s in samples] == [0, 1, 2, 3, 4]
    assert [s.timestamp_ns - start for s in samples] == [i * 250_000_000 for i in range(5)]
    assert all(s.rpy == (0.01, -0.02, 0.03) and s.finite for s in samples)


async def test_calibration_can_carry_nan_and_overridden_values():
    stream = SyntheticCalibration(count=4, nan_at={1}, overrides={2: (0.0, 0.1, 0.2)})
    with anyio.fail_after(30):
        async with virtual_time():
            samples = [s async for s in stream]
    assert not samples[1].finite and all(math.isnan(v) for v in samples[1].rpy)
    assert samples[2].rpy == (0.0, 0.1, 0.2)
    assert samples[0].rpy == samples[3].rpy == (0.0, 0.0, 0.0)


async def test_missing_and_silenced_calibration_leaves_gaps_in_time():
    stream = SyntheticCalibration(count=10, missing={1, 2}, silent_after=5)
    with anyio.fail_after(30):
        async with virtual_time():
            start = clock_ns()
            samples = [s async for s in stream]
            ended = clock_ns()
    assert [s.seq for s in samples] == [0, 3, 4]
    assert samples[1].timestamp_ns - start == 750_000_000
    assert ended - start == 9 * 250_000_000  # silent, but still on its pace until the end


async def test_a_calibration_consumer_that_gives_up_waiting_loses_no_sample():
    stream = SyntheticCalibration()
    with anyio.fail_after(30):
        async with virtual_time():
            await anext(stream)
            with anyio.move_on_after(0.1):
                await anext(stream)
            assert (await anext(stream)).seq == 1


async def test_a_closed_calibration_stream_ends():
    with anyio.fail_after(30):
        async with virtual_time():
            async with SyntheticCalibration() as stream:
                await anext(stream)
            with pytest.raises(StopAsyncIteration):
                await anext(stream)


# --- the video-file camera ------------------------------------------------------------------


def write_video(path: Path, images: list[np.ndarray], fps: float) -> None:
    height, width = images[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (width, height))
    assert writer.isOpened()
    for image in images:
        writer.write(image)
    writer.release()


def gray_images(count: int, width: int = 64, height: int = 48) -> list[np.ndarray]:
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    return [
        np.broadcast_to(40 + 100 * x + 10 * k, (height, width, 3)).astype(np.uint8)
        for k in range(count)
    ]


async def test_a_jpeg_range_video_is_converted_to_limited_range_bt601_interleaved_u_then_v(
    tmp_path, ledger
):
    rng = np.random.default_rng(5)
    bgr = cv2.GaussianBlur(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8), (9, 9), 3)
    path = tmp_path / "noise.avi"
    write_video(path, [bgr], fps=20)  # MJPG: full-range (JPEG) YUV 4:2:0
    with anyio.fail_after(30):
        async with VideoFileCamera(path) as camera:
            frame = await anext(camera)
        await workers_returned(ledger)
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420).astype(int)  # limited-range BT.601
    u = i420[48:].ravel()[: 24 * 32].reshape(24, 32)
    v = i420[48:].ravel()[24 * 32 :].reshape(24, 32)
    assert frame.y.min() >= 16 and frame.y.max() <= 235  # the limited range
    assert np.abs(frame.y.astype(int) - i420[:48]).mean() < 3  # MJPG is lossy
    assert np.abs(frame.uv[:, 0::2].astype(int) - u).mean() < 3  # U first, as NV12 has it
    assert np.abs(frame.uv[:, 1::2].astype(int) - v).mean() < 3
    assert not frame.buffer[: 48 * 128].reshape(48, 128)[:, 64:].any()  # the padding is 0


async def test_a_video_file_round_trips_with_its_geometry_luma_and_pace(tmp_path, ledger):
    images = gray_images(5)
    path = tmp_path / "cabin.avi"
    write_video(path, images, fps=50)
    with anyio.fail_after(30):
        async with VideoFileCamera(path) as camera:
            started = now()
            frames = [f async for f in camera]
            elapsed = now() - started
        await workers_returned(ledger)
    assert [f.frame_id for f in frames] == [0, 1, 2, 3, 4]
    assert all((f.width, f.height, f.stride) == (64, 48, 128) for f in frames)
    assert [b.timestamp_sof - a.timestamp_sof for a, b in itertools.pairwise(frames)] == [
        20_000_000
    ] * 4
    assert all(f.timestamp_eof == f.timestamp_sof for f in frames)  # no cabin camera: no readout
    assert elapsed >= 4 * 0.020
    for frame, image in zip(frames, images, strict=True):
        expected = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)[:48].astype(int)
        assert np.abs(frame.y.astype(int) - expected).mean() < 3  # MJPG is lossy
        assert np.abs(frame.uv.astype(int) - 128).max() <= 3  # gray: no chroma


async def test_a_video_is_resized_to_a_camera_and_paced_at_a_given_rate(tmp_path, ledger):
    blue = np.zeros((48, 64, 3), np.uint8)
    blue[..., 0] = 200
    path = tmp_path / "blue.avi"
    write_video(path, [blue] * 3, fps=5)
    with anyio.fail_after(30):
        async with VideoFileCamera(path, size=OS_FISHEYE, fps=100, loop=True) as camera:
            frames = await take(camera, 5)  # loops past the end of the 3-frame file
        await workers_returned(ledger)
    assert [f.frame_id for f in frames] == [0, 1, 2, 3, 4]
    assert all(f.size == (1344, 760) and f.buffer.size == 2_428_928 for f in frames)
    assert frames[1].timestamp_sof - frames[0].timestamp_sof == 10_000_000
    assert frames[0].timestamp_eof - frames[0].timestamp_sof == 11_000_000  # os_fisheye readout
    u, v = frames[4].uv[:, 0::2], frames[4].uv[:, 1::2]
    assert u.mean() > 180 and abs(v.mean() - 115) < 10  # blue: high U, V a little under 128


async def test_a_missing_video_file_is_a_clear_error(tmp_path):
    with (
        anyio.fail_after(10),
        pytest.raises(FileNotFoundError, match=r"nowhere\.avi does not exist"),
    ):
        await anext(VideoFileCamera(tmp_path / "nowhere.avi"))


async def test_an_undecodable_video_file_is_a_clear_error(tmp_path, ledger):
    path = tmp_path / "noise.avi"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    camera = VideoFileCamera(path, fps=20)
    with anyio.fail_after(10):
        with pytest.raises(VideoDecodeError, match=r"noise\.avi"):
            await anext(camera)
        await camera.aclose()
        await workers_returned(ledger)


# --- recording and replay -------------------------------------------------------------------


async def test_a_recording_replays_the_same_bytes_retimed_with_the_recorded_timestamps_kept(
    tmp_path, ledger
):
    path = tmp_path / "cabin.dmsrec"
    source = SyntheticCamera("os_fisheye", fps=200, frames=5, drop={2}, switch_at=4)
    with anyio.fail_after(30):
        originals = [f async for f in source]
        with FrameRecorder(path) as recorder:
            for frame in originals:
                recorder.write(frame)
        before = clock_ns()
        replayed, arrivals = [], []
        async with ReplayCamera(path) as replay:
            async for frame in replay:
                replayed.append(frame)
                arrivals.append(clock_ns())
        await workers_returned(ledger)
    assert [f.frame_id for f in replayed] == [0, 1, 3, 4, 5]
    for original, copy in zip(originals, replayed, strict=True):
        assert copy.size == original.size and copy.stride == original.stride
        np.testing.assert_array_equal(copy.buffer, original.buffer)
        assert (copy.recorded_sof, copy.recorded_eof) == (
            original.timestamp_sof,
            original.timestamp_eof,
        )
        assert (
            copy.timestamp_eof - copy.timestamp_sof
            == original.timestamp_eof - original.timestamp_sof
        )
        assert (copy.timestamp_sof - replayed[0].timestamp_sof) == (
            original.timestamp_sof - originals[0].timestamp_sof
        )
    assert replayed[0].timestamp_sof >= before  # on the replaying service's clock
    assert replayed[-1].size == (1928, 1208)  # the recorded resolution change
    assert all(
        t >= f.timestamp_eof for t, f in zip(arrivals, replayed, strict=True)
    )  # paced: never early


async def test_record_frames_records_a_source_up_to_a_count(tmp_path, ledger):
    path = tmp_path / "five.dmsrec"
    with anyio.fail_after(30):
        async with SyntheticCamera("os_fisheye", fps=200) as camera:
            assert await record_frames(camera, path, frames=3) == 3
        await workers_returned(ledger)
    with RecordingReader(path) as reader:
        assert len(reader) == 3
        assert [r.frame_id for r in reader.records] == [0, 1, 2]
        assert reader.read(2).timestamp_sof - reader.read(0).timestamp_sof == 10_000_000


def small_frames(count: int = 3, *, step_ns: int = 50_000_000) -> list[Frame]:
    """64x48 frames, each of its own shade, ``step_ns`` apart."""
    frames = []
    for k in range(count):
        y = np.full((48, 64), 20 + k, np.uint8)
        uv = np.full((24, 64), 128, np.uint8)
        sof = 1_000_000_000 + k * step_ns
        frames.append(
            Frame.from_planes(y, uv, frame_id=k, timestamp_sof=sof, timestamp_eof=sof + 1)
        )
    return frames


def small_recording(path: Path, count: int = 3, *, step_ns: int = 50_000_000) -> list[int]:
    """A recording of 64x48 frames written the old way (format version 1, uncompressed);
    returns each record's byte offset."""
    frames = small_frames(count, step_ns=step_ns)
    offsets = write_v1(path, frames)
    assert offsets == [
        FILE_HEADER.size + k * (RECORD_HEADER_V1.size + frame.buffer.size)
        for k, frame in enumerate(frames)
    ]
    return offsets


def patch(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def test_an_empty_or_foreign_file_is_not_a_recording(tmp_path):
    path = tmp_path / "x.dmsrec"
    path.write_bytes(b"")
    with pytest.raises(ReplayFormatError, match=r"file header at byte 0: truncated: 0 of 16"):
        RecordingReader(path)
    path.write_bytes(b"RIFF" + bytes(60))
    with pytest.raises(ReplayFormatError, match=r"not a frame recording: magic b'RIFF"):
        RecordingReader(path)
    small_recording(path)
    patch(path, 8, struct.pack("<I", 9))
    with pytest.raises(
        ReplayFormatError, match=r"format version 9, this reader reads versions 1 and 2"
    ):
        RecordingReader(path)


def test_a_truncated_record_header_names_the_record_and_its_offset(tmp_path):
    path = tmp_path / "x.dmsrec"
    offsets = small_recording(path)
    path.write_bytes(path.read_bytes()[: offsets[2] + 10])
    with pytest.raises(ReplayFormatError) as info:
        RecordingReader(path)
    assert (info.value.record, info.value.offset) == (2, offsets[2])
    assert f"frame record 2 at byte {offsets[2]}: truncated header: 10 of 56 bytes" in str(
        info.value
    )


def test_truncated_frame_data_names_what_was_announced_and_what_is_there(tmp_path):
    path = tmp_path / "x.dmsrec"
    offsets = small_recording(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(
        ReplayFormatError,
        match=rf"frame record 2 at byte {offsets[2]}: truncated data: .* 294912 bytes .* 294812",
    ):
        RecordingReader(path)


def test_a_bad_marker_or_geometry_is_corrupt(tmp_path):
    path = tmp_path / "x.dmsrec"
    offsets = small_recording(path)
    patch(path, offsets[1], b"JUNK")
    with pytest.raises(ReplayFormatError, match=r"frame record 1 .*bad record marker b'JUNK'"):
        RecordingReader(path)
    offsets = small_recording(path)
    patch(path, offsets[1] + 12, struct.pack("<I", 64))  # stride
    with pytest.raises(ReplayFormatError, match=r"stride 64 .* expected stride 128 and 294912"):
        RecordingReader(path)
    offsets = small_recording(path)
    patch(path, offsets[1] + 4, struct.pack("<I", 63))  # width
    with pytest.raises(ReplayFormatError, match=r"frame record 1 .*bad geometry.*63x48"):
        RecordingReader(path)


def test_time_going_back_is_corrupt(tmp_path):
    path = tmp_path / "x.dmsrec"
    small_recording(path, step_ns=-1_000)
    with pytest.raises(ReplayFormatError, match=r"frame record 1 .*goes back"):
        RecordingReader(path)


async def test_a_replay_reads_every_frame_on_one_thread_of_its_own(tmp_path, ledger, monkeypatch):
    import threading

    from pipelines.dms.frames.recording_reader import RecordingReader

    path = tmp_path / "cabin.dmsrec"
    threads: list[threading.Thread] = []
    read = RecordingReader.read

    def reading(self, index):
        threads.append(threading.current_thread())
        return read(self, index)

    monkeypatch.setattr(RecordingReader, "read", reading)
    with anyio.fail_after(30):
        with FrameRecorder(path) as recorder:
            async for frame in SyntheticCamera("os_fisheye", fps=200, frames=6):
                recorder.write(frame)
        async with ReplayCamera(path) as replay:
            replayed = [frame async for frame in replay]
        await workers_returned(ledger)
    assert len(replayed) == 6 and len(threads) == 6
    assert len({t.name for t in threads}) == 1  # not a thread started per frame
    assert threading.current_thread() not in threads  # and not the event loop's


async def test_corrupt_frame_data_is_reported_when_that_frame_is_replayed(tmp_path, ledger):
    path = tmp_path / "x.dmsrec"
    offsets = small_recording(path, step_ns=1_000_000)
    patch(path, offsets[1] + RECORD_HEADER_V1.size + 100, b"\xff")
    with anyio.fail_after(10):
        async with ReplayCamera(path) as replay:
            first = await anext(replay)
            with pytest.raises(
                ReplayFormatError, match=r"frame record 1 .*corrupt data: CRC32"
            ) as info:
                await anext(replay)
        await workers_returned(ledger)
    assert first.frame_id == 0 and info.value.offset == offsets[1]


async def test_a_missing_recording_is_a_clear_error(tmp_path, ledger):
    with anyio.fail_after(10):
        with pytest.raises(FileNotFoundError, match=r"nothing\.dmsrec"):
            await anext(ReplayCamera(tmp_path / "nothing.dmsrec"))
        await workers_returned(ledger)


async def test_a_synthetic_frames_buffer_is_used_again_only_once_nothing_refers_to_it():
    camera = await opened(SyntheticCamera())
    with anyio.fail_after(30):
        async with virtual_time():
            kept = await anext(camera)
            y, before = kept.y, kept.y.copy()  # a view of its buffer, and what it shows
            del kept
            for _ in range(12):  # more frames than the camera keeps buffers for, each let go
                await anext(camera)
            assert np.array_equal(y, before)  # the view kept its buffer from being used again
            first = (await anext(camera)).buffer.ctypes.data  # let go at once
            again = (await anext(camera)).buffer.ctypes.data
    assert again == first


async def test_a_synthetic_frame_costs_about_one_buffer_copy():
    """A loose guard (shared, noisy machines): typically 0.3-0.5 ms, far under a frame period."""
    camera = SyntheticCamera()
    costs = []
    with anyio.fail_after(30):
        await camera.open()
        async with virtual_time():  # the pacing takes no real time: what is left is the work
            for _ in range(30):
                start = time.perf_counter()
                await anext(camera)
                costs.append(time.perf_counter() - start)
    assert float(np.median(costs)) < 0.010
