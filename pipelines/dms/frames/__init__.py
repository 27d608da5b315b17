"""Frames and where they come from: the frame and its NV12 layout (:mod:`.frame`), the source
protocol and its pacing (:mod:`.source`), recorded input run live as a camera delivers it
(:mod:`.recorded`), our recordings' format (:mod:`.recording`, :mod:`.recording_reader`), and one
module a kind of camera source: synthetic (:mod:`.synthetic`), a recording of ours
(:mod:`.replay`), a video file (:mod:`.video`), an openpilot route segment (:mod:`.segment`).

Here, the one place that knows every source: what kind of input a path is (:func:`classify`), and
the table of the camera sources (:data:`SOURCES`): each row names its kind, the inputs it reads,
its module (imported only when the kind is used) and the class in it that reads such a camera,
and the extra it needs, refused in one line where it is missing (:func:`check_camera`).
:func:`open_camera` and :func:`open_first` open the source a camera setting names. Adding a
source is one module, one row and, where a new setting names it, one config line. The sources of
the calibration the model runs with are a table too (:data:`CALIBRATIONS`,
:func:`calibration_kind`).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ...extras import VIDEO, Extra
from ..config.kinds import CameraFile, CameraSpec
from ..config.text import Calibration
from ..openpilot.segment_log import VIDEO_NAME
from .source import CLOSE_BOUND, CalibrationSample, FrameSource

__all__ = [
    "CALIBRATIONS",
    "SOURCES",
    "CalibrationKind",
    "InputKind",
    "SourceKind",
    "calibration_kind",
    "check_camera",
    "classify",
    "open_camera",
    "open_first",
    "source_kind",
]


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


@dataclass(frozen=True)
class SourceKind:
    """A kind of camera source."""

    name: str
    """What it is called, in errors."""
    module: str
    """Its module, relative to this package."""
    source: str
    """The class in it that reads such a camera: called with the path and ``paced=`` (a live
    source that reads no path: with nothing)."""
    inputs: tuple[InputKind, ...] = ()
    """The kinds of path it reads (none: a live camera, which reads no file)."""
    extra: Extra | None = None
    """The extra it needs installed (None: the service's own)."""
    opens_first: bool = False
    """Opened as the service starts (:func:`open_first`), so that one that cannot be read is
    refused before any work starts; every other source opens as its first frame is asked for."""

    @property
    def live(self) -> bool:
        """A live camera (it reads no file): paced only, never replayed."""
        return not self.inputs

    def load(self) -> Any:
        """The class that reads such a camera (its module imported now)."""
        return getattr(importlib.import_module(self.module, __name__), self.source)

    def check_environment(self, spec: CameraSpec) -> None:
        """What it needs installed is there: :class:`ValueError` with the line that says what to
        install."""
        if self.extra is not None and (missing := self.extra.missing()) is not None:
            raise ValueError(f"camera {str(spec)!r}: {self.extra.lacking(missing)}")

    def open(self, spec: CameraSpec, *, paced: bool = True) -> FrameSource:
        """The source that reads ``spec`` (not opened yet)."""
        self.check_environment(spec)
        if self.live:
            if not paced:
                raise ValueError(
                    f"the {self.name} camera is live: replay a recording, a video file or a segment"
                )
            return self.load()()  # type: ignore[no-any-return]
        assert isinstance(spec, CameraFile)
        return self.load()(spec.path, paced=paced)  # type: ignore[no-any-return]


SOURCES = (
    SourceKind("synthetic", ".synthetic", "SyntheticCamera"),
    SourceKind("recording", ".replay", "ReplayCamera", (InputKind.RECORDING,)),
    SourceKind("video", ".video", "VideoFileCamera", (InputKind.VIDEO,), VIDEO),
    # a directory that is not a segment is read as one: the segment says what it lacks
    SourceKind(
        "segment",
        ".segment",
        "SegmentCamera",
        (InputKind.SEGMENT, InputKind.DIRECTORY),
        VIDEO,
        opens_first=True,
    ),
)
"""Every kind of camera source, the default first."""


def source_kind(spec: CameraSpec) -> SourceKind:
    """The row of the source that reads ``spec``: the synthetic camera's, or the one that reads
    what the path holds (:func:`classify`). :class:`FileNotFoundError` saying so for a path
    that is not there; :class:`OSError` for a file that cannot be read."""
    if not isinstance(spec, CameraFile):
        return SOURCES[0]
    try:
        kind = classify(spec.path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"camera {str(spec)!r}: no such file (or use 'synthetic')"
        ) from None
    return next(row for row in SOURCES if kind in row.inputs)


def check_camera(spec: CameraSpec) -> None:
    """What the camera ``spec`` names needs installed is there (a video file or a route segment
    needs the video extra: PyAV). :class:`ValueError` with the line that says what to install;
    :class:`OSError` for a file that cannot be read."""
    source_kind(spec).check_environment(spec)


def open_camera(spec: CameraSpec, *, paced: bool = True) -> FrameSource:
    """The source ``spec`` names (its row's, :func:`source_kind`), not opened yet.
    ``paced=False``: a file or a segment as fast as it is asked for (a live camera is paced
    only: :class:`ValueError`)."""
    return source_kind(spec).open(spec, paced=paced)


async def open_first(spec: CameraSpec, *, paced: bool = True) -> FrameSource | None:
    """The source ``spec`` names, opened now, where its kind opens first (an openpilot route
    segment: its log read and matched to its video, on the source's worker thread, within its
    bounds), so that one that cannot be read is refused before any work starts: the error the
    source raises (:class:`~pipelines.dms.openpilot.segment_log.SegmentError`, a ``LogError``, a
    :class:`~aio_runtime.CameraTimeout`; the source is closed). None for any other camera (and
    for a path that cannot be read): those open as their first frame is asked for, and one that
    cannot is a camera that failed."""
    try:
        kind = source_kind(spec)
    except OSError:
        return None
    if not kind.opens_first:
        return None
    source = kind.open(spec, paced=paced)
    try:
        await source.open()  # type: ignore[attr-defined]
    except BaseException:
        with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_BOUND):
            await source.aclose()
        raise
    return source


# --- calibration ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationKind:
    """A kind of source of the calibration the model runs with, chosen by the ``calib``
    setting."""

    name: str
    """What it is called."""
    chosen: Callable[[Calibration | None], bool]
    """Whether the ``calib`` setting's value chooses it."""
    module: str | None = None
    """The module of its stream, relative to this package (None: it has none to follow — the
    value is the calibration, and never ages)."""
    stream: str | None = None
    """The class in it whose instances are the stream of samples, made with nothing."""

    @property
    def follows(self) -> bool:
        """It is a stream of samples to follow (not a value)."""
        return self.module is not None

    def open(self) -> AsyncIterable[CalibrationSample]:
        """Its stream, not started (:class:`ValueError` for a kind that has none)."""
        if self.module is None or self.stream is None:
            raise ValueError(f"a {self.name} calibration is a value, not a stream")
        stream = getattr(importlib.import_module(self.module, __name__), self.stream)
        return stream()  # type: ignore[no-any-return]


CALIBRATIONS = (
    CalibrationKind("static", lambda calib: calib is not None),
    CalibrationKind("synthetic", lambda calib: calib is None, ".synthetic", "SyntheticCalibration"),
)
"""Every kind of calibration source: a static calibration (``--calib R,P,Y``), else the
synthetic ``liveCalibration`` stream (4 Hz)."""


def calibration_kind(calib: Calibration | None) -> CalibrationKind:
    """The row the ``calib`` setting's value chooses."""
    return next(row for row in CALIBRATIONS if row.chosen(calib))
