"""Frames and where they come from: the frame and its NV12 layout (:mod:`.frame`), the source
protocol and its pacing (:mod:`.source`), and every source, one module each: synthetic
(:mod:`.synthetic`), a video file (:mod:`.video`), a recording of ours (:mod:`.recording`,
:mod:`.recording_reader`, replayed by :mod:`.replay`), an openpilot route segment
(:mod:`.segment`); recorded input run live reads ahead (:mod:`.recorded`).

Here, the one place that knows every source: what kind of input a path is (:func:`classify`),
and the source a camera setting names (:func:`open_camera`, :func:`open_segment`). A source's
module is imported only when it is opened.
"""

from __future__ import annotations

import enum
from pathlib import Path

import anyio

from ...extras import VIDEO
from ..config.kinds import CameraFile, CameraSpec
from ..openpilot.segment_log import VIDEO_NAME
from .source import CLOSE_BOUND, FrameSource

__all__ = ["InputKind", "check_camera", "classify", "open_camera", "open_segment"]


class InputKind(enum.Enum):
    """What a path holds, as an input."""

    SEGMENT = "segment"
    """An openpilot route segment: a directory holding the driver camera's video."""
    RECORDING = "recording"
    """A recording of ours: a file whose first bytes say so."""
    VIDEO = "video"
    """Any other file: a video file, as a decoder reads it."""
    DIRECTORY = "directory"
    """A directory that is not a segment (a fleet walks it; as a camera, it is a segment that
    lacks its video)."""


def classify(path: Path) -> InputKind:
    """What ``path`` holds: a directory is a segment when it holds ``dcamera.hevc``; a file is a
    recording of ours when its first bytes say so, a video file otherwise. :class:`OSError`
    (``FileNotFoundError``) for a file that cannot be read."""
    if path.is_dir():
        return InputKind.SEGMENT if (path / VIDEO_NAME).is_file() else InputKind.DIRECTORY
    from .recording import FILE_MAGIC

    with path.open("rb") as f:
        magic = f.read(len(FILE_MAGIC))
    return InputKind.RECORDING if magic == FILE_MAGIC else InputKind.VIDEO


def check_camera(spec: CameraSpec) -> None:
    """What the camera ``spec`` names needs installed is there: a video file or a route segment
    needs the video extra (PyAV). :class:`ValueError` with the line that says what to install;
    :class:`OSError` for a file that cannot be read."""
    if isinstance(spec, CameraFile):
        _check_kind(spec, classify(spec.path))


def _check_kind(spec: CameraFile, kind: InputKind) -> None:
    if kind is not InputKind.RECORDING and (missing := VIDEO.missing()) is not None:
        raise ValueError(f"camera {str(spec)!r}: {VIDEO.lacking(missing)}")


def open_camera(spec: CameraSpec, *, paced: bool = True) -> FrameSource:
    """The source ``spec`` names: the synthetic camera; an openpilot route segment, for a
    directory (:class:`~pipelines.dms.frames.segment.SegmentCamera`); or a file — a
    recording of ours when its first bytes say so, else a video file. ``paced=False``: a file or
    a segment as fast as it is asked for (the synthetic camera is a camera: paced only)."""
    from .synthetic import SyntheticCamera

    if not isinstance(spec, CameraFile):
        if not paced:
            raise ValueError(
                "the synthetic camera is live: replay a recording, a video file or a segment"
            )
        return SyntheticCamera()
    try:
        kind = classify(spec.path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"camera {str(spec)!r}: no such file (or use 'synthetic')"
        ) from None
    _check_kind(spec, kind)
    if kind in (InputKind.SEGMENT, InputKind.DIRECTORY):  # the segment says what it lacks
        from .segment import SegmentCamera

        return SegmentCamera(spec.path, paced=paced)
    if kind is InputKind.RECORDING:
        from .replay import ReplayCamera

        return ReplayCamera(spec.path, paced=paced)
    from .video import VideoFileCamera

    return VideoFileCamera(spec.path, paced=paced)


async def open_segment(spec: CameraSpec, *, paced: bool = True) -> FrameSource | None:
    """The openpilot route segment ``spec`` names, opened now — its log read and matched to its
    video, on the source's worker thread, within its bounds — so that a segment that cannot be
    replayed is refused before any work starts (the error the source raises:
    :class:`~pipelines.dms.openpilot.segment_log.SegmentError`, a ``LogError``, a
    :class:`~aio_runtime.CameraTimeout`; the source is closed). None for any other camera: those
    open as their first frame is asked for, and one that cannot is a camera that failed."""
    if not (isinstance(spec, CameraFile) and spec.path.is_dir()):  # a directory: a segment
        return None
    from .segment import SegmentCamera

    source = SegmentCamera(spec.path, paced=paced)
    try:
        await source.open()
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_BOUND):
            await source.aclose()
        raise
    return source
