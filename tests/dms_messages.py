"""driverStateV2 messages for the sinks' tests: valid or invalid, with a given ``seq``."""

from __future__ import annotations

import numpy as np

from pipelines.dms.messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2

READY = dict.fromkeys(READINESS_LAYERS, True)
RUN_ID = "20250612T101530.123Z-3f9a1c2b"


def driver(value: float = 0.25) -> dict[str, object]:
    data: dict[str, object] = dict.fromkeys(DRIVER_FIELDS, np.float32(value))
    data["faceOrientation"] = np.array([0.1, 0.2, 0.3], dtype=np.float32)
    data["faceOrientationStd"] = [1.0, 1.0, 1.0]
    data["facePosition"] = [0.0, -0.1]
    data["facePositionStd"] = [0.5, 0.5]
    return data


def message(seq: int = 0, *, valid: bool = True, raw: bytes | None = None) -> DriverStateV2:
    return DriverStateV2(
        seq=seq,
        run_id=RUN_ID,
        frame_id=100 + seq,
        timestamp_sof=1_000_000_000 + seq,
        timestamp_eof=1_000_500_000 + seq,
        frame_age=0.012,
        availability="available" if valid else "unavailable",
        reason="" if valid else "gpu-queue: compute timeline >= 5: timed out",
        valid=valid,
        readiness=READY if valid else {**READY, "taskComplete": False, "outputValid": False},
        model_execution_time=0.009,
        gpu_execution_time=0.008,
        wheel_on_right_prob=0.01 if valid else None,
        left_driver_data=driver() if valid else None,
        right_driver_data=driver(0.5) if valid else None,
        raw_predictions=raw,
    )
