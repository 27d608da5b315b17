"""Scripted runs for the report's tests: messages as the service publishes them, each step one
message, frames 50 ms apart, so every time the report derives is known in advance."""

from __future__ import annotations

import json
from dataclasses import dataclass

from dms_messages import READY, driver

from pipelines.dms.messages import DriverStateV2, new_run_id
from pipelines.dms.report import Message

INTERVAL = 0.05
BUDGET = 0.05
START_NS = 5_000_000_000
STATE = {"A": "available", "D": "degraded", "U": "unavailable"}


@dataclass(frozen=True)
class Step:
    state: str
    """A, D or U."""
    reason: str = ""
    age: float = 0.03
    status: bool = False
    """A status message (no frame): no frame id, its age the newest frame's."""
    skip: int = 0
    """Frame ids skipped before this frame (dropped)."""
    model: float = 0.012
    valid: bool | None = None
    """Whether the frame is valid (None: AVAILABLE, with no reason, and a frame)."""
    why: str = ""
    """The availability's reason (``availabilityReason``); "" as in older records."""


def ok(age: float = 0.03) -> Step:
    return Step("A", age=age)


def records(
    steps: list[Step], *, extra: dict[str, object] | None = None
) -> list[dict[str, object]]:
    """The steps' messages as records, one run (with a run id of its own; ``extra``: fields added
    to every record)."""
    out: list[dict[str, object]] = []
    run_id = new_run_id()
    frame = 0
    for seq, step in enumerate(steps):
        frame += step.skip
        valid = step.state == "A" and not step.reason and not step.status
        if step.valid is not None:
            valid = step.valid
        message = DriverStateV2(
            seq=seq,
            run_id=run_id,
            frame_id=-1 if step.status else frame,
            timestamp_sof=0 if step.status else START_NS + round(frame * INTERVAL * 1e9),
            timestamp_eof=0 if step.status else START_NS + round(frame * INTERVAL * 1e9) + 10**7,
            frame_age=step.age,
            availability=STATE[step.state],
            reason=step.reason,
            availability_reason=step.why,
            valid=valid,
            late=valid and step.age > BUDGET,
            readiness=READY,
            model_execution_time=0.0 if step.status else step.model,
            gpu_execution_time=0.0 if step.status else step.model * 0.8,
            left_driver_data=driver() if valid else None,
            right_driver_data=driver() if valid else None,
        )
        out.append({**message.to_record(), **(extra or {})})
        if not step.status:
            frame += 1
    return out


def lines(steps: list[Step], **how: dict[str, object]) -> list[str]:
    return [json.dumps(record) for record in records(steps, **how)]


def messages(steps: list[Step], **how: dict[str, object]) -> list[Message]:
    return [Message.from_record(record) for record in records(steps, **how)]


FIRST_AGE = 0.03
"""The first message's frame age in these runs: the run's time 0 is its publication."""


def sof(frame: int) -> float:
    """Frame ``frame``'s start on the run's axis."""
    return frame * INTERVAL - FIRST_AGE


def published(frame: int, age: float = 0.03) -> float:
    """When frame ``frame``, ``age`` old, was published, on the run's axis."""
    return sof(frame) + age


GPU_HANG = [
    Step("U", "recovering: unavailable (accelerator: opening session (attempt 1))"),
    Step("U", "recovering: unavailable (accelerator: opening session (attempt 1))"),
    ok(), ok(), ok(), ok(),
    Step("U", "gpu-queue: the accelerator has made no progress for 0.126 s", age=0.15),
    Step("U", "model unavailable: the accelerator is restarting (gpu-queue: ...)", skip=1),
    Step("U", "model unavailable: the accelerator is restarting (gpu-queue: ...)"),
    Step("U", "recovering: unavailable (accelerator: opening session (attempt 2))"),
    Step("U", "recovering: unavailable (accelerator: opening session (attempt 2))"),
    ok(), ok(), ok(),
    Step("D", "invalid output: output value 0 is nan"),
    Step("D", "invalid output: output value 0 is nan"),
    Step("U", "no valid output: 10 frames in a row; invalid output: output value 0 is nan"),
    Step("U", "recovering: unavailable (no valid output: 10 frames in a row)"),
    ok(), ok(),
    Step("U", "camera: a camera frame: timed out after 0.25 s", age=0.27, status=True),
    Step("U", "recovering: unavailable (camera: a camera frame: timed out)", skip=5),
    ok(), ok(),
]  # fmt: skip
"""A start-up, a GPU hang with a restart, an invalid output that escalates to UNAVAILABLE, a
camera stall, each recovered: 24 messages."""
