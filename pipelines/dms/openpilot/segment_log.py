"""An openpilot route segment's files, and what its log says about the driver camera's video.

A segment directory (openpilot names it ``<route>--<segment number>``; the name is not required)
holds the driver (cabin) camera's video, ``dcamera.hevc`` — a raw HEVC stream, without
timestamps — and the segment's full log (:data:`~.logs.LOG_NAMES`: ``rlog.zst``, ``rlog.bz2`` or
``rlog``). The log times the video's frames:

- a **camera state** Event (``cabinCameraState``, ``driverCameraState`` in older logs: the same
  ordinal, @70) per camera frame: its ``frameId``, ``timestampSof`` and ``timestampEof`` (ns, the
  device's clock);
- an **encode index** Event (``cabinEncodeIdx``, older ``driverEncodeIdx``, @76) per encoded
  frame: video frame ``k`` is the camera frame whose encode index has ``segmentId`` ``k``. The
  encoder drops frames, so camera states without an encoded frame are normal. The index's
  ``type`` is not read: its enum differs between openpilot versions, and a segment's driver video
  has one index either way. A video frame whose camera state is not in this log (one near the
  segment's start may be in the previous segment's) takes the timestamps its encode index
  carries, which the encoder copies from the camera.

Without encode index Events, video frame ``k`` is the ``k``-th camera state in log order; camera
states beyond the video's length are skipped, counted. :func:`read_segment_index` does the
matching; :func:`segment_driver_states` reads openpilot's own model outputs from the same log.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .events import DRIVER_STATE
from .logs import LOG_NAMES, find_log, read_log

__all__ = [
    "CAMERA_STATE",
    "ENCODE_INDEX",
    "VIDEO_NAME",
    "SegmentError",
    "SegmentFiles",
    "SegmentFrame",
    "SegmentIndex",
    "match_frames",
    "read_segment_index",
    "segment_driver_states",
    "segment_files",
]

VIDEO_NAME = "dcamera.hevc"
"""The driver (cabin) camera's video in a segment directory."""
CAMERA_STATE = "cabinCameraState"
"""The Event member of the cabin camera's frames (``driverCameraState`` in older schemas)."""
ENCODE_INDEX = "cabinEncodeIdx"
"""The Event member of the cabin video's encode index (``driverEncodeIdx`` in older schemas)."""


class SegmentError(ValueError):
    """A route segment that cannot be replayed: not a segment directory, no driver video or no
    log, a log that does not time the video, a video that cannot be decoded. The message is one
    line that names the segment. (A log that cannot be read at all is a
    :class:`~.logs.LogError`.)"""


@dataclass(frozen=True)
class SegmentFiles:
    """A segment directory's driver video and log."""

    directory: Path
    video: Path
    log: Path


def segment_files(directory: str | os.PathLike[str]) -> SegmentFiles:
    """The driver video and the log of the segment in ``directory`` (only the directory is
    looked at: nothing is read); :class:`SegmentError` saying which is missing."""
    path = Path(directory)
    where = f"route segment {str(path)!r}"
    if not path.is_dir():
        found = "no such directory" if not path.exists() else "not a directory"
        raise SegmentError(f"{where}: {found} (expected a segment directory, <route>--<N>)")
    video = path / VIDEO_NAME
    if not video.is_file():
        raise SegmentError(f"{where}: no {VIDEO_NAME} (the driver camera's video)")
    log = find_log(path)
    if log is None:
        raise SegmentError(f"{where}: no log (expected {', '.join(LOG_NAMES)})")
    for file in (video, log):
        if not os.access(file, os.R_OK):
            raise SegmentError(f"{where}: {file.name} cannot be read (permission denied)")
    return SegmentFiles(path, video, log)


@dataclass(frozen=True)
class SegmentFrame:
    """The camera frame a video frame holds: its id and timestamps as the log has them."""

    frame_id: int
    timestamp_sof: int
    timestamp_eof: int


@dataclass(frozen=True)
class SegmentIndex:
    """The log's account of a segment's video."""

    frames: tuple[SegmentFrame | None, ...]
    """For each frame of the video, in order: its camera frame, or None for one the log does not
    time (skipped)."""
    by_encode_index: bool
    """Matched through encode index Events (else in camera-state order)."""
    camera_states: int
    """Camera states in the log."""
    not_encoded: int = 0
    """Camera states without an encoded frame (the encoder dropped them)."""
    beyond_video: int = 0
    """Without an encode index: camera states beyond the video's length (skipped)."""
    timed_by_encode_index: int = 0
    """Video frames without a camera state in this log, timed by their encode index."""

    @property
    def matched(self) -> int:
        """Video frames with a camera frame: the frames the segment delivers."""
        return sum(frame is not None for frame in self.frames)

    @property
    def untimed(self) -> int:
        """Video frames the log does not time (skipped)."""
        return len(self.frames) - self.matched


def _camera_states(events: Iterable[Any]) -> tuple[list[SegmentFrame], list[Any]]:
    """The camera states (as frames) and the encode index Events' members, in log order."""
    states: list[SegmentFrame] = []
    encoded: list[Any] = []
    for event in events:
        member = event.which()
        if member == CAMERA_STATE:
            state = event.cabinCameraState
            states.append(SegmentFrame(state.frameId, state.timestampSof, state.timestampEof))
        elif member == ENCODE_INDEX:
            encoded.append(event.cabinEncodeIdx)
    return states, encoded


def match_frames(
    states: list[SegmentFrame],
    encoded: list[tuple[int, int, int, int]],
    video_frames: int,
    where: str,
) -> SegmentIndex:
    """Match a video of ``video_frames`` frames to the log's camera ``states`` (in log order)
    through the ``encoded`` index entries, (segmentId, frameId, timestampSof, timestampEof) each
    (none: in camera-state order). ``where`` names the segment in errors. :class:`SegmentError`
    for a log without camera states, or a video shorter than its encode index says."""
    if not states:
        raise SegmentError(
            f"{where}: the log holds no cabin camera states ({CAMERA_STATE}, "
            "driverCameraState in older logs): nothing times the video's frames"
        )
    if not encoded:
        frames: list[SegmentFrame | None] = list(states[:video_frames])
        frames += [None] * (video_frames - len(frames))
        beyond = max(0, len(states) - video_frames)
        return SegmentIndex(tuple(frames), False, len(states), beyond_video=beyond)
    highest = max(entry[0] for entry in encoded)
    if highest >= video_frames:
        raise SegmentError(
            f"{where}: the video holds {video_frames} frames, its encode index refers to "
            f"{highest + 1} (frame {highest}): a truncated or wrong {VIDEO_NAME}"
        )
    by_id: dict[int, SegmentFrame] = {}
    for state in states:
        by_id.setdefault(state.frame_id, state)
    slots: list[SegmentFrame | None] = [None] * video_frames
    timed_by_index = 0
    for segment_id, frame_id, sof, eof in encoded:
        if slots[segment_id] is not None:
            continue  # the first entry for a video frame holds
        logged = by_id.get(frame_id)
        if logged is None and sof > 0 and eof >= sof:
            logged = SegmentFrame(frame_id, sof, eof)
            timed_by_index += 1
        slots[segment_id] = logged
    encoded_ids = {frame.frame_id for frame in slots if frame is not None}
    return SegmentIndex(
        tuple(slots),
        True,
        len(states),
        not_encoded=sum(frame_id not in encoded_ids for frame_id in by_id),
        timed_by_encode_index=timed_by_index,
    )


def read_segment_index(log: Path, video_frames: int, where: str) -> SegmentIndex:
    """Read ``log`` (blocking: a worker thread's work) and match its camera states to a video
    of ``video_frames`` frames (:func:`match_frames`). A log that cannot be read:
    :class:`~.logs.LogError`."""
    states, encoded = _camera_states(read_log(log))
    entries = [
        (index.segmentId, index.frameId, index.timestampSof, index.timestampEof)
        for index in encoded
    ]
    return match_frames(states, entries, video_frames, where)


def segment_driver_states(directory: str | os.PathLike[str]) -> dict[int, Any]:
    """openpilot's own ``driverStateV2`` Events in the log of the segment in ``directory``, by
    their ``frameId`` (the first Event for a frame holds), as Event readers:
    ``states[frame_id].driverStateV2.leftDriverData.faceProb``, ``.valid``, ``.logMonoTime``.
    Empty for a log without them. Blocking (reads the whole log): call it off the event loop.
    :class:`SegmentError` for a directory that is not a segment, :class:`~.logs.LogError` for a
    log that cannot be read."""
    states: dict[int, Any] = {}
    for event in read_log(segment_files(directory).log):
        if event.which() == DRIVER_STATE:
            states.setdefault(event.driverStateV2.frameId, event)
    return states
