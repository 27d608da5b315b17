"""Recordings, format version 2: each frame compressed losslessly with zstd (or stored as it is
where that is no smaller), checked as it is read; old uncompressed recordings still read."""

from __future__ import annotations

import struct
import threading
import zlib

import anyio
import numpy as np
import pytest
import zstandard
from recordings_v1 import write_v1
from test_dms_camera import patch, small_frames, workers_returned

from pipelines.dms.frames.frame import Frame, nv12_layout
from pipelines.dms.frames.recording import (
    CODEC_RAW,
    CODEC_ZSTD,
    FILE_HEADER,
    FORMAT_VERSION,
    RECORD_HEADER,
    FrameRecorder,
    ReplayFormatError,
    record_frames,
)
from pipelines.dms.frames.recording_reader import RecordingReader
from pipelines.dms.frames.replay import ReplayCamera
from pipelines.dms.frames.synthetic import SyntheticCamera

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def synthetic_frames(count: int, camera: str = "ar_ox_fisheye") -> list[Frame]:
    async with SyntheticCamera(camera, fps=400, frames=count) as source:
        return [frame async for frame in source]


def noise_frame(frame_id: int = 0) -> Frame:
    """A frame of random bytes, its padding too: nothing to compress."""
    layout = nv12_layout(64, 48)
    buffer = np.random.default_rng(frame_id).integers(0, 256, layout.size, dtype=np.uint8)
    sof = 1_000_000_000 + frame_id
    return Frame(
        buffer, 64, 48, layout.stride, frame_id=frame_id, timestamp_sof=sof, timestamp_eof=sof + 1
    )


def same_frames(read: list[Frame], written: list[Frame]) -> None:
    assert len(read) == len(written)
    for copy, original in zip(read, written, strict=True):
        assert (copy.frame_id, copy.size, copy.stride) == (
            original.frame_id,
            original.size,
            original.stride,
        )
        assert (copy.timestamp_sof, copy.timestamp_eof) == (
            original.timestamp_sof,
            original.timestamp_eof,
        )
        np.testing.assert_array_equal(copy.buffer, original.buffer)


async def test_a_cabin_cameras_frames_are_compressed_losslessly_to_a_small_share(tmp_path):
    frames = await synthetic_frames(3)
    path = tmp_path / "cabin.dmsrec"
    with FrameRecorder(path) as recorder:
        for frame in frames:
            recorder.write(frame)
    assert recorder.bytes_written == path.stat().st_size
    raw = sum(frame.buffer.size for frame in frames)
    assert path.stat().st_size < raw / 20  # measured: ~20 kB for a 4.8 MB frame
    with RecordingReader(path) as reader:
        assert reader.version == FORMAT_VERSION == 2
        assert {record.codec for record in reader.records} == {CODEC_ZSTD}
        same_frames([reader.read(k) for k in range(len(reader))], frames)


def test_a_frame_compressing_would_not_shrink_is_stored_as_it_is(tmp_path):
    path = tmp_path / "noise.dmsrec"
    frames = [noise_frame(0), *small_frames(1)]
    frames[1] = frames[1].retimed(2_000_000_000, 2_000_000_001)
    with FrameRecorder(path) as recorder:
        for frame in frames:
            recorder.write(frame)
    with RecordingReader(path) as reader:
        codecs = [(record.codec, record.stored == record.size) for record in reader.records]
        assert codecs == [(CODEC_RAW, True), (CODEC_ZSTD, False)]
        read = [reader.read(k) for k in range(2)]
    for copy, original in zip(read, frames, strict=True):
        np.testing.assert_array_equal(copy.buffer, original.buffer)


def test_without_compression_every_frame_is_stored_as_it_is(tmp_path):
    path = tmp_path / "plain.dmsrec"
    frames = small_frames(2)
    with FrameRecorder(path, compress=False) as recorder:
        for frame in frames:
            recorder.write(frame)
    assert path.stat().st_size == FILE_HEADER.size + sum(
        RECORD_HEADER.size + frame.buffer.size for frame in frames
    )
    with RecordingReader(path) as reader:
        assert {record.codec for record in reader.records} == {CODEC_RAW}
        same_frames([reader.read(k) for k in range(2)], frames)


async def test_an_old_uncompressed_recording_reads_and_replays_as_before(tmp_path, ledger):
    frames = await synthetic_frames(3, "os_fisheye")
    path = tmp_path / "old.dmsrec"
    write_v1(path, frames)
    with RecordingReader(path) as reader:
        assert reader.version == 1 and len(reader) == 3
        same_frames([reader.read(k) for k in range(3)], frames)
    with anyio.fail_after(30):
        async with ReplayCamera(path, paced=False) as replay:
            replayed = [frame async for frame in replay]
        await workers_returned(ledger)
    assert [frame.recorded_sof for frame in replayed] == [f.timestamp_sof for f in frames]
    for copy, original in zip(replayed, frames, strict=True):
        np.testing.assert_array_equal(copy.buffer, original.buffer)


def test_a_recorder_asked_not_to_replace_a_file_refuses_one_that_exists(tmp_path):
    path = tmp_path / "taken.dmsrec"
    path.write_bytes(b"someone else's")
    with pytest.raises(FileExistsError):
        FrameRecorder(path, exist_ok=False)
    assert path.read_bytes() == b"someone else's"


def recording(tmp_path, count: int = 3) -> tuple[object, list[int]]:
    """A compressed recording of small frames; its path and each record's byte offset."""
    path = tmp_path / "x.dmsrec"
    with FrameRecorder(path) as recorder:
        for frame in small_frames(count):
            recorder.write(frame)
    with RecordingReader(path) as reader:
        return path, [record.offset for record in reader.records]


def field_at(name: str) -> int:
    """A version 2 record header field's offset within the header."""
    sizes = {"size": 40, "stored": 48, "crc32": 56, "codec": 60}
    assert RECORD_HEADER.size == 64
    return sizes[name]


def test_an_unknown_codec_is_reported_as_the_recording_opens(tmp_path):
    path, offsets = recording(tmp_path)
    patch(path, offsets[1] + field_at("codec"), struct.pack("<I", 7))
    with pytest.raises(ReplayFormatError, match=r"frame record 1 at byte \d+: unknown codec 7"):
        RecordingReader(path)


def test_compressed_data_cut_short_names_what_was_announced(tmp_path):
    path, offsets = recording(tmp_path)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(
        ReplayFormatError, match=rf"frame record 2 at byte {offsets[2]}: truncated data: the header"
    ):
        RecordingReader(path)


def test_a_frame_stored_as_it_is_must_be_stored_whole(tmp_path):
    path = tmp_path / "x.dmsrec"
    with FrameRecorder(path, compress=False) as recorder:
        recorder.write(small_frames(1)[0])
    patch(path, FILE_HEADER.size + field_at("stored"), struct.pack("<Q", 100))
    with pytest.raises(ReplayFormatError, match=r"100 bytes stored for a frame of 294912"):
        RecordingReader(path)


async def test_corrupt_compressed_data_is_reported_when_that_frame_is_read(tmp_path, ledger):
    path, offsets = recording(tmp_path)
    stored = offsets[2] - offsets[1] - RECORD_HEADER.size
    patch(path, offsets[1] + RECORD_HEADER.size + stored // 2, b"\x5a\xa5\x5a")
    with anyio.fail_after(10):
        async with ReplayCamera(path, paced=False) as replay:
            first = await anext(replay)
            with pytest.raises(ReplayFormatError, match=r"frame record 1 .*corrupt data") as info:
                await anext(replay)
        await workers_returned(ledger)
    assert first.frame_id == 0 and info.value.offset == offsets[1]


def test_a_zstd_frame_that_decodes_to_another_size_is_corrupt(tmp_path):
    frame = small_frames(1)[0]
    short = zstandard.ZstdCompressor().compress(bytes(frame.buffer.size - 1))
    path = tmp_path / "x.dmsrec"
    with path.open("wb") as file:
        file.write(FILE_HEADER.pack(b"DMSNV12\x00", 2, 0))
        file.write(
            RECORD_HEADER.pack(
                b"FRME", 64, 48, frame.stride, 0, 0, 1, frame.buffer.size, len(short),
                zlib.crc32(frame.buffer.data), CODEC_ZSTD,
            )
        )  # fmt: skip
        file.write(short)
    with RecordingReader(path) as reader:
        with pytest.raises(ReplayFormatError, match=r"corrupt data: zstd: the zstd frame holds"):
            reader.read(0)


async def test_recording_runs_on_one_worker_thread_and_a_cancelled_one_is_left_whole(
    tmp_path, ledger, monkeypatch
):
    threads: set[str] = set()
    for name in ("__init__", "write", "close"):
        original = getattr(FrameRecorder, name)

        def watched(self, *args, _original=original, **kwargs):
            threads.add(threading.current_thread().name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(FrameRecorder, name, watched)
    path = tmp_path / "cut.dmsrec"
    scope = anyio.CancelScope()

    async def source():
        for k, frame in enumerate(small_frames(6, step_ns=1_000)):
            if k == 3:
                scope.cancel()  # the recording is stopped as it takes its fourth frame
            yield frame

    with anyio.fail_after(30):
        with scope:
            await record_frames(source(), path, frames=6)
        await workers_returned(ledger)
    assert threads == {"recording"} and threading.current_thread().name not in threads
    with RecordingReader(path) as reader:  # every record whole
        assert 3 <= len(reader) < 6
        same_frames(
            [reader.read(k) for k in range(len(reader))], small_frames(len(reader), step_ns=1_000)
        )
