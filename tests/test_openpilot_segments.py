"""openpilot route segments as a camera: the driver video decoded into camerad's NV12 layout, each
frame given the frame id and timestamps the segment's log has for it (through the encode index
when there is one), and every way a segment can be unfit refused with a clear error.

The segments are built by ``openpilot_segments.build_segment`` (HEVC through PyAV's libx265, logs
through our schema). Sources that decode on their worker thread run in real time here, except
where a test holds virtual time while the thread works (``threads_busy``).
"""

from __future__ import annotations

import threading

import anyio
import av
import numpy as np
import pytest
from openpilot_segments import U, V, build_segment, event
from test_dms_camera import workers_returned

from aio_runtime import CameraTimeout, Ledger, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms.config.kinds import CameraFile
from pipelines.dms.frames import open_camera
from pipelines.dms.frames import segment as segments
from pipelines.dms.frames.frame import nv12_layout
from pipelines.dms.frames.segment import SegmentCamera
from pipelines.dms.frames.source import clock_ns
from pipelines.dms.openpilot.logs import LogError
from pipelines.dms.openpilot.segment_log import SegmentError, segment_driver_states

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # hold= is for asyncio's loop


async def replayed(path, **options) -> tuple[SegmentCamera, list]:
    """Every frame of the segment at ``path``, unpaced (and the closed source)."""
    with anyio.fail_after(60):
        async with SegmentCamera(path, paced=False, **options) as camera:
            frames = [frame async for frame in camera]
    return camera, frames


@pytest.mark.parametrize("log", ["rlog", "rlog.zst", "rlog.bz2"])
@pytest.mark.parametrize("encode_type", [1, 5], ids=["fullHEVC", "old-front"])
async def test_frames_carry_the_log_s_ids_and_timestamps_through_the_encode_index(
    tmp_path, ledger, log, encode_type
):
    built = build_segment(tmp_path / "seg--3", frames=9, dropped={2, 5, 6}, log=log,
                          encode_type=encode_type)  # fmt: skip
    before = clock_ns()
    camera, frames = await replayed(built.path)
    await workers_returned(ledger)
    assert [f.frame_id for f in frames] == built.frame_ids == [1000, 1001, 1003, 1004, 1007, 1008]
    assert [(f.recorded_sof, f.recorded_eof) for f in frames] == [
        (logged.timestamp_sof, logged.timestamp_eof) for logged in built.frames
    ]
    # on the service's clock, stamped as decoded (unpaced), each with its readout
    assert all(f.timestamp_sof >= before for f in frames)
    assert all(f.timestamp_eof - f.timestamp_sof == 11_000_000 for f in frames)
    index = camera.index
    assert index is not None and index.by_encode_index
    assert (index.camera_states, index.not_encoded, index.untimed) == (9, 3, 0)
    assert camera.length == 6 and camera.delivered == 6


async def test_without_an_encode_index_video_frames_follow_the_camera_states_in_order(
    tmp_path, ledger
):
    built = build_segment(tmp_path / "seg--0", frames=5, encode_index=False, first_frame_id=7)
    camera, frames = await replayed(built.path)
    await workers_returned(ledger)
    assert [f.frame_id for f in frames] == [7, 8, 9, 10, 11]
    assert [f.recorded_sof for f in frames] == [f.timestamp_sof for f in built.frames]
    assert camera.index is not None and not camera.index.by_encode_index


async def test_camera_states_beyond_the_video_are_skipped_counted_and_reported_once(
    tmp_path, ledger, captured_logs
):
    built = build_segment(tmp_path / "seg--0", frames=8, encode_index=False, video_frames=5)
    camera, frames = await replayed(built.path)
    await workers_returned(ledger)
    assert [f.frame_id for f in frames] == [1000, 1001, 1002, 1003, 1004]
    assert camera.index is not None and camera.index.beyond_video == 3
    reports = [e for e in captured_logs if "beyond the video" in e["event"]]
    assert len(reports) == 1 and reports[0]["skipped"] == 3 and reports[0]["video_frames"] == 5


async def test_a_frame_whose_camera_state_is_not_in_the_log_is_timed_by_its_encode_index(
    tmp_path, ledger
):
    built = build_segment(tmp_path / "seg--1", frames=4, states_missing={0})
    camera, frames = await replayed(built.path)
    await workers_returned(ledger)
    assert [(f.frame_id, f.recorded_sof, f.recorded_eof) for f in frames] == [
        (logged.frame_id, logged.timestamp_sof, logged.timestamp_eof) for logged in built.frames
    ]
    assert camera.index is not None and camera.index.timed_by_encode_index == 1


@pytest.mark.parametrize(("width", "height"), [(1344, 760), (1928, 1208)])
async def test_decoded_frames_are_nv12_in_camerad_s_layout_close_to_what_was_encoded(
    tmp_path, ledger, width, height
):
    built = build_segment(tmp_path / "seg--0", frames=3, size=(width, height))
    _, frames = await replayed(built.path)
    await workers_returned(ledger)
    layout = nv12_layout(width, height)
    assert len(frames) == 3
    for k, frame in enumerate(frames):
        assert frame.size == (width, height) and frame.stride == layout.stride
        assert frame.buffer.size == layout.size
        rows = frame.buffer[: layout.uv_offset].reshape(layout.y_height, layout.stride)
        assert not rows[:, width:].any() and not rows[height:].any()  # padding: zeros
        assert not frame.buffer[layout.uv_offset + (height // 2) * layout.stride :].any()
        error = np.abs(frame.y.astype(np.int16) - built.images[k])
        assert error.mean() < 1.5 and np.percentile(error, 99) <= 6  # HEVC is lossy
        others = [np.abs(frame.y.astype(np.int16) - image).mean() for image in built.images]
        assert int(np.argmin(others)) == k  # each frame is its own, in order
        assert np.abs(frame.uv[:, 0::2].astype(np.int16) - U).max() <= 2  # U first, then V
        assert np.abs(frame.uv[:, 1::2].astype(np.int16) - V).max() <= 2


async def test_a_paced_segment_delivers_its_frames_at_the_log_s_own_intervals(tmp_path):
    built = build_segment(tmp_path / "seg--0", frames=8, dropped={3, 4}, period_ns=45_000_000)
    with use_ledger(Ledger()) as ledger:
        async with virtual_time(autojump_threshold=0.005, hold=threads_busy(ledger)) as clock:
            with anyio.fail_after(30):
                start = clock.now()
                arrivals, frames = [], []
                async with SegmentCamera(built.path) as camera:
                    async for frame in camera:
                        frames.append(frame)
                        arrivals.append(clock_ns())
                elapsed = clock.now() - start
    recorded = [f.timestamp_sof for f in built.frames]
    assert [f.timestamp_sof - frames[0].timestamp_sof for f in frames] == [
        sof - recorded[0] for sof in recorded
    ]  # the log's spacing, the encoder's drops' gap included
    assert all(t >= f.timestamp_eof for t, f in zip(arrivals, frames, strict=True))
    assert elapsed == pytest.approx((recorded[-1] - recorded[0] + 11_000_000) / 1e9, abs=0.01)


async def test_opening_and_decoding_run_on_one_worker_thread_of_the_source(
    tmp_path, ledger, monkeypatch
):
    built = build_segment(tmp_path / "seg--0", frames=4)
    threads: dict[str, list[threading.Thread]] = {"open": [], "decode": []}
    count, decode = segments.count_video_frames, segments.nv12_from_video

    def counting(*args):
        threads["open"].append(threading.current_thread())
        return count(*args)

    def decoding(frame):
        threads["decode"].append(threading.current_thread())
        return decode(frame)

    monkeypatch.setattr(segments, "count_video_frames", counting)
    monkeypatch.setattr(segments, "nv12_from_video", decoding)
    _, frames = await replayed(built.path)
    await workers_returned(ledger)
    used = threads["open"] + threads["decode"]
    assert len(frames) == 4 and len(threads["open"]) == 1 and len(threads["decode"]) == 4
    assert len({t.name for t in used}) == 1  # one thread of its own, not one per frame
    assert threading.current_thread() not in used  # never the event loop's


async def test_a_decode_that_overruns_its_bound_is_a_camera_timeout(tmp_path, monkeypatch):
    built = build_segment(tmp_path / "seg--0", frames=3)
    release = threading.Event()
    decode = segments.nv12_from_video

    def stuck(frame):
        release.wait(30)  # a decoder that hangs until the test lets it go
        return decode(frame)

    camera = SegmentCamera(built.path, paced=False, decode_timeout=2.0)
    with anyio.fail_after(30):
        await camera.open()  # in real time: its thread's work is not what is tested
    monkeypatch.setattr(segments, "nv12_from_video", stuck)
    try:
        async with virtual_time() as clock:  # the bound passes in virtual time, at once
            start = clock.now()
            with pytest.raises(CameraTimeout, match="decoding a frame of route segment") as info:
                await anext(camera)
            assert clock.now() - start == pytest.approx(2.0)
    finally:
        release.set()
        with anyio.fail_after(30):
            await camera.aclose()
    assert info.value.timeout == 2.0


async def test_a_stop_while_the_segment_opens_comes_out_as_itself_and_the_decoder_is_closed(
    tmp_path, monkeypatch
):
    """The close queued behind an open still running gives up after its bound, without raising
    in place of the stop; the open, as it finishes, closes the decoder it made."""
    built = build_segment(tmp_path / "seg--0", frames=3)
    release, opening = threading.Event(), threading.Event()
    read_index = segments.read_segment_index

    def slow_index(*args, **kwargs):
        opening.set()
        release.wait(30)  # a log that takes long to read, until the test lets it go
        return read_index(*args, **kwargs)

    monkeypatch.setattr(segments, "read_segment_index", slow_index)
    camera = SegmentCamera(built.path, paced=False, decode_timeout=2.0)
    with anyio.CancelScope() as stop:
        async with anyio.create_task_group() as tg:
            tg.start_soon(camera.open)
            with anyio.fail_after(30):
                await anyio.to_thread.run_sync(opening.wait)
            stop.cancel()  # Ctrl-C while the open runs on the worker thread
    assert stop.cancelled_caught
    worker = camera._worker
    assert worker is not None and worker._thread is not None
    async with virtual_time():  # the close's bound passes in virtual time, at once
        await camera.aclose()  # gives up waiting for the open: no CameraTimeout raised
    release.set()
    await anyio.to_thread.run_sync(worker._thread.join, 30)  # the open ends, then the thread
    assert not worker._thread.is_alive()
    assert camera._opened is not None and camera._video is None  # its decoder made, and closed


async def test_a_frame_that_cannot_be_decoded_is_an_error_when_it_is_reached(tmp_path, ledger):
    def noise(position, width, height):
        return np.random.default_rng(position).integers(16, 235, (height, width), np.uint8)

    built = build_segment(tmp_path / "seg--0", frames=6, image=noise)
    video = built.path / "dcamera.hevc"
    with av.open(str(video), format="hevc") as container:
        sizes = [p.size for p in container.demux(container.streams.video[0]) if p.size]
    data = bytearray(video.read_bytes())
    at = sum(sizes[:3]) + 6  # frame 3's slice header, just past its start code and NAL header
    data[at : at + 8] = b"\xff" * 8
    video.write_bytes(bytes(data))
    frames = []
    with anyio.fail_after(60):
        async with SegmentCamera(built.path, paced=False) as camera:
            with pytest.raises(SegmentError, match=r"video frame 3 of dcamera\.hevc cannot be"):
                async for frame in camera:
                    frames.append(frame)
    await workers_returned(ledger)
    assert [f.frame_id for f in frames] == built.frame_ids[:3]


def _not_a_directory(path):
    path.write_bytes(b"a file")


def _no_video(path):
    build_segment(path, video=False)


def _no_log(path):
    build_segment(path, log=None)


def _no_camera_states(path):
    build_segment(path, camera_states=False)


def _short_video(path):
    build_segment(path, frames=6, video_frames=4)


def _not_hevc(path):
    build_segment(path)
    (path / "dcamera.hevc").write_bytes(b"not a video" * 100)


def _empty_video(path):
    build_segment(path)
    (path / "dcamera.hevc").write_bytes(b"")


def _corrupt_log(path):
    build_segment(path)
    (path / "rlog").write_bytes(b"\x07" * 64)


BAD_SEGMENTS = {
    "not-a-directory": (_not_a_directory, SegmentError, r"not a directory"),
    "missing": (lambda path: None, SegmentError, r"no such directory"),
    "no-video": (_no_video, SegmentError, r"no dcamera\.hevc \(the driver camera's video\)"),
    "no-log": (_no_log, SegmentError, r"no log \(expected rlog\.zst, rlog\.bz2, rlog\)"),
    "no-camera-states": (_no_camera_states, SegmentError, r"holds no cabin camera states"),
    "short-video": (
        _short_video, SegmentError, r"the video holds 4 frames, its encode index refers to 6"
    ),
    "not-hevc": (_not_hevc, SegmentError, r"dcamera\.hevc is not an HEVC stream: Invalid data"),
    "empty-video": (_empty_video, SegmentError, r"dcamera\.hevc holds no video frames"),
    "corrupt-log": (_corrupt_log, LogError, r"rlog: not a capnp Event after 0 Events"),
}  # fmt: skip
"""A segment that cannot be replayed: how to make it, the error, what its message says."""


@pytest.mark.parametrize(("make", "error", "says"), BAD_SEGMENTS.values(), ids=BAD_SEGMENTS)
async def test_a_segment_that_cannot_be_replayed_is_refused_as_it_opens(
    tmp_path, ledger, make, error, says
):
    path = tmp_path / "seg--0"
    make(path)
    camera = SegmentCamera(path)
    with anyio.fail_after(30):
        with pytest.raises(error, match=says) as info:
            await camera.open()
        await camera.aclose()
    await workers_returned(ledger)
    assert "\n" not in str(info.value) and "seg--0" in str(info.value)


def test_a_directory_as_the_camera_is_opened_as_a_segment(tmp_path):
    build_segment(tmp_path / "seg--0")
    source = open_camera(CameraFile(tmp_path / "seg--0"), paced=False)
    assert isinstance(source, SegmentCamera) and not source.paced
    assert source.path == tmp_path / "seg--0"


def test_openpilot_s_own_driver_states_are_read_by_frame_id(tmp_path):
    states = []
    for frame_id, face in ((1000, 0.25), (1002, 0.75)):
        state = event(5_000_000_000 + frame_id, "driverStateV2", frameId=frame_id)
        state.driverStateV2.init("leftDriverData").faceProb = face
        states.append(state.to_bytes())
    build_segment(tmp_path / "seg--0", frames=3, log="rlog.zst", extra_events=states)
    found = segment_driver_states(tmp_path / "seg--0")
    assert sorted(found) == [1000, 1002]
    assert found[1002].driverStateV2.leftDriverData.faceProb == 0.75
    assert found[1000].logMonoTime == 5_000_001_000
    assert segment_driver_states(build_segment(tmp_path / "other--0").path) == {}
