"""An application's code typed against the installed DMS service: ``mypy --strict`` finds no
error in it (the wheel ships its type information)."""

from __future__ import annotations

import asyncio

from aio_runtime import Availability
from pipelines.dms import DmsService, ServiceConfig, Summary


async def valid_messages(config: ServiceConfig) -> tuple[int, Summary]:
    """How many valid messages a run published, and its summary."""
    valid = 0
    async with DmsService(config) as service:

        async def read() -> None:
            nonlocal valid
            async for message in service.messages():
                if message.valid:
                    valid += 1

        reader = asyncio.create_task(read())
        summary = await service.finished()
        reader.cancel()
    return valid, summary


def unavailable_now(service: DmsService) -> bool:
    return service.availability.state.availability is Availability.UNAVAILABLE


def frames_received(summary: Summary) -> int:
    return summary.frames.received


if __name__ == "__main__":
    valid, summary = asyncio.run(valid_messages(ServiceConfig(frames=40, health_port=None)))
    print(f"{valid} valid of {frames_received(summary)}")
