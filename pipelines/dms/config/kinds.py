"""The kinds of value the service's settings take: the mode, the device, the camera.

Kept apart from :mod:`pipelines.dms.config.settings`, which declares the settings that take them and
re-exports them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from .text import Unexpected
from .values import readable_file

__all__ = [
    "CAMERA_PATHS",
    "CameraFile",
    "CameraSpec",
    "DeviceKind",
    "Mode",
    "Synthetic",
    "camera_value",
    "parse_camera",
]


class Mode(enum.StrEnum):
    """How the service takes its frames, and what its sinks do when a reader is slow."""

    LIVE = "live"
    """A camera (or a file played as one), paced: frames join the stages latest-frame-wins, each
    frame's budget starts at its start of frame, and publishing never waits — a sink that cannot
    keep up drops, counted."""
    REPLAY = "replay"
    """A file, as fast as the stages go: each stage waits for the next (no frame dropped), each
    frame's budget starts when the camera stage hands it on, and sinks apply backpressure —
    nothing is lost."""


class DeviceKind(enum.StrEnum):
    """Where the model runs."""

    SIM = "sim"
    """The simulated accelerator: a GPU behind a USB-PCIe bridge, through ``transports``."""
    CPU = "cpu"
    """onnxruntime on the CPU."""


@dataclass(frozen=True)
class Synthetic:
    """The synthetic cabin camera."""

    def __str__(self) -> str:
        return "synthetic"


CAMERA_PATHS = "a video file, a recording or an openpilot route segment directory"
"""What a camera path may name."""


@dataclass(frozen=True)
class CameraFile:
    """A camera read from a path: a video file, a recording of ours (replayed), or an openpilot
    route segment — a directory holding the driver camera's ``dcamera.hevc`` and the segment's
    log (:mod:`pipelines.dms.frames.segment`). Which, the path says when it is checked or
    opened (a directory is a segment; a file, its first bytes say), on the machine that runs the
    camera."""

    path: Path

    def __str__(self) -> str:
        return str(self.path)

    def check_environment(self) -> None:
        """The path can be read as a camera: a file that can be read, or a directory with a
        segment's video and log (only looked at: nothing is read). :class:`ValueError` saying
        what was expected."""
        try:
            directory = self.path.is_dir()
        except OSError:
            directory = False  # not one the machine can look at: the file check says why
        if directory:
            from ..openpilot.segment_log import segment_files

            segment_files(self.path)
            return
        readable_file("camera", self.path, f"expected 'synthetic', {CAMERA_PATHS}")


CameraSpec = Synthetic | CameraFile


def camera_value(value: object) -> str | None:
    ok = isinstance(value, (Synthetic, CameraFile))
    return None if ok else "must be 'synthetic', a video file, a recording or a segment directory"


def parse_camera(text: str) -> CameraSpec:
    """``synthetic``, or the path of a video file, a recording or a route segment directory
    (a segment directory's name ends in ``--<segment number>``; that is not required)."""
    if not text:
        raise Unexpected(f"expected 'synthetic', {CAMERA_PATHS}", text)
    return Synthetic() if text == "synthetic" else CameraFile(Path(text))
