"""Calibration as the service holds it: the latest good sample, and why a newer one was refused.

A static calibration never goes stale. A stream's samples are taken as they come; a sample that is
not finite is refused and named, and the last good one ages instead (openpilot's rule: stale after
``stale_after`` seconds).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterable
from dataclasses import dataclass

import numpy as np

from aio_runtime import Reason

from ..config.text import Calibration
from ..frames.source import CalibrationSample, closing

__all__ = ["Calibrated", "CalibrationState"]


@dataclass(frozen=True)
class Calibrated:
    """A calibration the model can take: ``values`` (1, 3) float32, from a sample at ``at``
    (loop clock seconds; infinite for a static calibration)."""

    values: np.ndarray
    at: float


class CalibrationState:
    """The calibration frames run with. ``static``: one that never changes (and never ages)."""

    def __init__(self, *, stale_after: float, static: Calibration | None = None) -> None:
        self.stale_after = stale_after
        self.latest: Calibrated | None = None
        if static is not None:
            self.latest = Calibrated(np.asarray(static, np.float32).reshape(1, 3), math.inf)
        self.rejected: Reason | None = None
        """Why the newest sample was refused, while it is the newest."""

    async def follow(self, stream: AsyncIterable[CalibrationSample]) -> None:
        """Take the stream's samples until it ends (closing it, if it can be closed)."""
        async with closing(stream):
            async for sample in stream:
                self.take(sample)

    def take(self, sample: CalibrationSample) -> None:
        values = np.asarray(sample.rpy, dtype=np.float64).reshape(1, 3)
        if not np.isfinite(values).all():  # refused: the last good one ages instead
            self.rejected = Reason("calibration rejected", str(values.ravel().tolist()))
            return
        self.rejected = None
        self.latest = Calibrated(values.astype(np.float32), sample.timestamp_ns / 1e9)

    def problem(self, used: Calibrated | None, now: float) -> Reason | None:
        """What is wrong with the calibration a frame ran with, as of ``now``: missing, stale or
        refused (None: nothing)."""
        if used is not None and now - used.at <= self.stale_after:
            return None
        return self.rejected or Reason("calibration missing or stale")
