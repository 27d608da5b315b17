"""openpilot route segments built for tests: a driver video (``dcamera.hevc``, HEVC through
PyAV's libx265) and the segment's log (Events written with our schema), in the shapes real
segments take and the ways they go wrong.

``build_segment(directory, frames=N)`` writes a camera that took ``N`` frames (ids from
``first_frame_id``, ``period_ns`` apart, each ``readout_ns`` long); the log holds a camera state
Event (``cabinCameraState``) per camera frame and an encode index Event (``cabinEncodeIdx``) per
encoded one, in the order openpilot logs them. Options:

- ``size``: the frames' (width, height) — small by default; (1928, 1208) or (1344, 760) for a
  cabin camera the warp and the model take;
- ``log``: ``"rlog"`` (plain), ``"rlog.zst"``, ``"rlog.bz2"``, or None for no log;
- ``dropped``: camera frames (by position, 0 = the first) the encoder dropped: logged, not in
  the video nor in the encode index;
- ``encode_index=False``: no encode index Events (video frames match camera states in order);
- ``camera_states=False``: no camera state Events; ``states_missing``: camera frames (by
  position) whose camera state is left out (their encode index still times them);
- ``video_frames``: keep only the first so many encoded frames in the video (a truncated video;
  the log still indexes them all); ``video=False``: no ``dcamera.hevc``;
- ``encode_type``: the encode index's ``type`` (1 is ``fullHEVC`` in current schemas, 5 the
  driver file's ``front`` in old ones: readers must not filter on it);
- ``keyframe_every``: a keyframe every so many encoded frames (else the encoder's choice);
- ``extra_events``: more Event bytes to log after the camera's, e.g. openpilot's own
  ``driverStateV2`` for a frame, built with :func:`event` —
  ``event(1_000, "driverStateV2", frameId=1000)`` — and filled in through its builder.

It returns a :class:`BuiltSegment`: the directory, and for each video frame the luma plane and
chroma values it was encoded from with the camera frame it is (id, timestamps) — what a reader
must deliver, frame for frame (HEVC is lossy: compare the luma within a tolerance).
"""

from __future__ import annotations

import bz2
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
import zstandard

from pipelines.dms.openpilot.events import schema

__all__ = ["U", "V", "BuiltSegment", "LoggedFrame", "build_segment", "event", "luma", "write_hevc"]

U, V = 96, 160
"""The chroma every frame is encoded with (U and V differ: NV12's order shows)."""


@dataclass(frozen=True)
class LoggedFrame:
    """A camera frame as the built log has it."""

    frame_id: int
    timestamp_sof: int
    timestamp_eof: int


@dataclass
class BuiltSegment:
    path: Path
    """The segment directory."""
    frames: list[LoggedFrame] = field(default_factory=list)
    """The camera frame of each video frame, in video order."""
    images: list[np.ndarray] = field(default_factory=list)
    """The luma plane each video frame was encoded from (height x width)."""
    camera: list[LoggedFrame] = field(default_factory=list)
    """Every camera frame (the encoder's drops too), in order."""

    @property
    def frame_ids(self) -> list[int]:
        return [frame.frame_id for frame in self.frames]


def luma(position: int, width: int, height: int) -> np.ndarray:
    """A video frame's luma plane: a smooth gradient (which HEVC keeps well) shifted by the
    frame's position, different for every frame."""
    rows, columns = np.mgrid[0:height, 0:width]
    return (32 + (rows + 2 * columns + 9 * position) % 180).astype(np.uint8)


def write_hevc(
    path: Path,
    images: Sequence[np.ndarray],
    *,
    rate: int = 20,
    bitrate: int | None = None,
    keyframe_every: int | None = None,
) -> None:
    """``images`` (luma planes) as a raw HEVC stream, chroma :data:`U`, :data:`V`, without
    B-frames (as openpilot's encoder: decode order is display order); at ``bitrate`` (bits/s,
    average), else at a constant quality that keeps the luma close; a keyframe every
    ``keyframe_every`` frames (else the encoder's choice)."""
    height, width = images[0].shape
    with av.open(str(path), "w", format="hevc") as container:
        stream = container.add_stream("libx265", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        quality = {"crf": "12"} if bitrate is None else {}
        if bitrate is not None:
            stream.bit_rate = bitrate
        stream.options = {
            "preset": "ultrafast",
            **quality,
            "x265-params": "log-level=none:bframes=0"
            + (
                ""
                if keyframe_every is None
                else f":keyint={keyframe_every}:min-keyint={keyframe_every}:scenecut=0"
            ),
        }
        u = np.full((height // 2) * (width // 2), U, np.uint8)
        v = np.full((height // 2) * (width // 2), V, np.uint8)
        for image in images:
            planes = np.concatenate([image.reshape(-1), u, v]).reshape(height * 3 // 2, width)
            frame = av.VideoFrame.from_ndarray(planes, format="yuv420p")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def event(log_mono_time: int, member: str, **fields: Any) -> Any:
    """An Event builder for ``member`` (``cabinCameraState``, ``driverStateV2`` ...) with
    ``fields`` set on the member; ``.to_bytes()`` once it is complete."""
    built = schema().Event.new_message()
    built.logMonoTime = log_mono_time
    body = built.init(member)
    for name, value in fields.items():
        setattr(body, name, value)
    return built


def _compressed(data: bytes, name: str) -> bytes:
    if name.endswith(".zst"):
        return zstandard.ZstdCompressor(level=10).compress(data)
    if name.endswith(".bz2"):
        return bz2.compress(data)
    return data


def build_segment(
    directory: Path,
    *,
    frames: int = 6,
    size: tuple[int, int] = (64, 48),
    log: str | None = "rlog",
    first_frame_id: int = 1000,
    start_ns: int = 5_000_000_000,
    period_ns: int = 50_000_000,
    readout_ns: int = 11_000_000,
    dropped: Iterable[int] = (),
    encode_index: bool = True,
    camera_states: bool = True,
    states_missing: Iterable[int] = (),
    video_frames: int | None = None,
    video: bool = True,
    encode_type: int = 1,
    extra_events: Sequence[bytes] = (),
    image: Callable[[int, int, int], np.ndarray] = luma,
    bitrate: int | None = None,
    keyframe_every: int | None = None,
) -> BuiltSegment:
    """Write a segment into ``directory`` (made if missing); see the module docstring."""
    directory.mkdir(parents=True, exist_ok=True)
    width, height = size
    dropped, missing = set(dropped), set(states_missing)
    built = BuiltSegment(directory)
    events: list[bytes] = []
    for position in range(frames):
        sof = start_ns + position * period_ns
        logged = LoggedFrame(first_frame_id + position, sof, sof + readout_ns)
        built.camera.append(logged)
        if camera_states and position not in missing:
            state = event(logged.timestamp_eof + 1_000_000, "cabinCameraState")
            body = state.cabinCameraState
            body.frameId, body.encodeId = logged.frame_id, position
            body.timestampSof, body.timestampEof = logged.timestamp_sof, logged.timestamp_eof
            body.sensor = 2  # ox03c10
            events.append(state.to_bytes())
        if position in dropped:
            continue
        segment_id = len(built.frames)
        built.frames.append(logged)
        built.images.append(image(segment_id, width, height))
        if encode_index:
            index = event(logged.timestamp_eof + 2_000_000, "cabinEncodeIdx")
            body = index.cabinEncodeIdx
            body.frameId, body.type, body.encodeId = logged.frame_id, encode_type, position
            body.segmentId = body.segmentIdEncode = segment_id
            body.timestampSof, body.timestampEof = logged.timestamp_sof, logged.timestamp_eof
            events.append(index.to_bytes())
    events.extend(extra_events)
    if video_frames is not None:
        built.frames, built.images = built.frames[:video_frames], built.images[:video_frames]
    if video:
        write_hevc(
            directory / "dcamera.hevc", built.images, bitrate=bitrate, keyframe_every=keyframe_every
        )
    if log is not None:
        (directory / log).write_bytes(_compressed(b"".join(events), log))
    return built
