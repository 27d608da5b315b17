"""The kinds of value the service's settings take: the mode, the device, the camera.

Kept apart from :mod:`pipelines.dms.config`, which declares the settings that take them and
re-exports them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CameraFile", "CameraSpec", "DeviceKind", "Mode", "Synthetic", "parse_camera"]


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


@dataclass(frozen=True)
class CameraFile:
    """A video file or a recording of ours (replayed); which of the two, its first bytes say
    when it is opened."""

    path: Path

    def __str__(self) -> str:
        return str(self.path)


CameraSpec = Synthetic | CameraFile


def parse_camera(text: str) -> CameraSpec:
    """``synthetic``, or the path of a video file or a recording."""
    if not text:
        raise ValueError("camera: expected 'synthetic', a video file or a recording, got ''")
    return Synthetic() if text == "synthetic" else CameraFile(Path(text))
