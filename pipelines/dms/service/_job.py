"""A frame in flight through the service: what it carries from stage to stage."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from aio_runtime import Deadline, deadline_scope

from ..frames.frame import Frame
from ._calibration import Calibrated
from .slots import Slot

__all__ = ["UNBUDGETED", "FrameJob", "JobSlot"]

UNBUDGETED = 30.0
"""A frame's bound with no budget (``--no-budget``): waits without a bound of their own (a warp,
a model run on the CPU) still have one, which only a stage that has stopped meets."""


@dataclass
class FrameJob:
    """One frame between the camera and publication. ``number`` counts frames as they reach the
    service (from 0); ``start`` is where its times begin, on the loop clock — live, its start of
    frame; replaying, when the camera stage handed it on —; ``deadline`` is ``start`` plus the
    budget (an output published later is late) and ``stale_at`` is ``start`` plus
    ``stale_after`` (an output later than it is of no use: every wait made for the frame ends
    there). With no budget both are :data:`UNBUDGETED` (30 s) after ``start``."""

    frame: Frame
    number: int
    start: float
    deadline: float
    stale_at: float
    image: np.ndarray | None = None
    """The warped luma, once warped."""
    calibration: Calibrated | None = None
    """The calibration the model ran with (None: none was fresh enough to use)."""
    output: np.ndarray | None = None
    """The model's flat output, once run."""
    device_time: float = 0.0
    """Seconds the model's device spent on it."""
    handed: float | None = None
    """When the model stage handed it to the model's device (loop clock); None until then."""
    stages: dict[str, float] = field(default_factory=dict)
    """Seconds per stage, by stage."""

    def bound_scope(self) -> AbstractContextManager[Deadline]:
        """The frame's staleness bound as a scope: every wait made for the frame inside it is
        bounded by what is left until ``stale_at`` (:class:`~aio_runtime.BudgetExhausted`
        past it)."""
        name = f"frame {self.frame.frame_id}"
        return deadline_scope(at=self.stale_at, started=self.start, name=name)


JobSlot = Slot[FrameJob]
"""Where a stage hands frames to the next."""
