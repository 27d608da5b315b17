# mypy: disallow-any-expr
"""An application embedding the DMS service through its public names only, as a user writes it.

``tests/test_dms_embedding.py`` type-checks it with ``mypy --strict`` and no expression of type
``Any`` allowed: every signature it touches is typed with the service's own types.
"""

from __future__ import annotations

import sys

from pipelines.dms import (
    Availability,
    AvailabilityState,
    BoundEndpoints,
    DeviceKind,
    DmsService,
    DriverStateV2,
    FaultSpec,
    HealthState,
    Mode,
    Reason,
    ServiceConfig,
    StartupError,
    SubscriptionStalled,
    Summary,
    SyntheticCalibration,
    SyntheticCamera,
    Transition,
    parse_faults,
)


def describe(message: DriverStateV2) -> str:
    kind: str | None = message.reason_kind
    late: bool = message.availability is Availability.DEGRADED and kind == "frame budget"
    return f"{message.seq} {message.frame_id} {message.valid} {message.reason} {late}"


async def follow(service: DmsService) -> Summary:
    bound: BoundEndpoints = await service.started()
    where: list[str | int | None] = [bound.health_host, bound.health_port, bound.health_url]
    print(*where, bound.zmq, *bound.lines(), file=sys.stderr)
    try:
        async for message in service.messages(backlog=10):
            print(describe(message), file=sys.stderr)
            if message.availability == Availability.AVAILABLE:
                break
    except SubscriptionStalled as stalled:
        print(stalled, file=sys.stderr)
    with service.transitions() as stream:
        async for transition in stream:
            first: Transition = transition
            state: AvailabilityState = first.current
            reason: Reason | None = state.reason
            print(state.availability, reason.kind if reason else None, file=sys.stderr)
            break
    health: HealthState = service.health()
    print(health.availability is Availability.AVAILABLE, service.source_length, file=sys.stderr)
    return await service.finished()


async def main() -> int:
    faults: list[FaultSpec] = parse_faults("nan-output@3")
    config = ServiceConfig(
        device=DeviceKind.CPU, mode=Mode.LIVE, frames=10, health_port=0, faults=tuple(faults)
    )
    try:
        async with DmsService(
            config, source=SyntheticCamera(frames=10), calibration=SyntheticCalibration()
        ) as service:
            summary = await follow(service)
    except StartupError as exc:
        setting: str | None = exc.setting
        print(exc, setting, file=sys.stderr)
        return 2
    return 0 if summary.frames.valid else 1
