"""Embedding the DMS service in a plain asyncio application.

The application's own tasks read every published driverStateV2 message and every availability
transition, beside whatever else the application does on its event loop. The service runs
on the embedded defaults (synthetic camera, the bundled reference model, the simulated accelerator)
with a GPU hang scripted at frame 30, so the application sees the service become unavailable and
come back.

    python examples/embed_asyncio.py
"""

from __future__ import annotations

import asyncio

from pipelines.dms.config import ServiceConfig
from pipelines.dms.service import DmsService


async def main() -> None:
    config = ServiceConfig(frames=80, faults="gpu-hang@30+10", health_port=None)
    valid = invalid = 0
    async with DmsService(config) as service:

        async def messages() -> None:
            nonlocal valid, invalid
            async for message in service.messages():
                if message.valid:
                    valid += 1
                else:
                    invalid += 1

        async def transitions() -> None:
            with service.transitions() as stream:
                async for transition in stream:
                    print("availability:", transition.current, flush=True)

        tasks = [asyncio.create_task(job()) for job in (messages, transitions)]
        await service.finished()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(f"messages: {valid} valid, {invalid} invalid")


if __name__ == "__main__":
    asyncio.run(main())
