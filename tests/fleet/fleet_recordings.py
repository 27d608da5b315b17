"""Synthetic recordings of our format for the fleet tests, made unpaced."""

from __future__ import annotations

from pathlib import Path

import anyio

from pipelines.dms.frames.recording import FrameRecorder
from pipelines.dms.frames.synthetic import SyntheticCamera

FRAME_INTERVAL_NS = 50_000_000
"""20 Hz, a cabin camera's rate."""


def write_recording(path: Path, frames: int, *, seed: int = 0) -> Path:
    """``frames`` frames of the synthetic cabin camera (its scene moving from step ``seed``),
    timed at 20 Hz from one second, written to ``path``."""

    async def made() -> None:
        async with SyntheticCamera("ar_ox_fisheye", fps=1000, frames=frames) as source:
            with FrameRecorder(path) as recorder:
                k = 0
                async for frame in source:
                    sof = 1_000_000_000 + (k + seed) * FRAME_INTERVAL_NS
                    recorder.write(frame.retimed(sof, sof + 20_000_000))
                    k += 1

    anyio.run(made)
    return path
