"""Embedding the DMS service in a plain asyncio application.

The application starts the service, learns where it listens, and follows it in tasks of its own
(beside whatever else it does on its event loop): one prints every availability transition, the
other reads every published driverStateV2 message. The service runs on the embedded defaults
(synthetic camera, the bundled reference model, the simulated accelerator) with no frame limit and
a GPU hang scripted at frame 30; once the messages say it has recovered, the application stops it.

    python examples/embed_asyncio.py
"""

from __future__ import annotations

import asyncio
import sys

from pipelines.dms import DmsService, FaultSpec, ServiceConfig, StartupError


async def print_transitions(service: DmsService) -> None:
    with service.transitions() as stream:  # the current state first, then every change
        async for transition in stream:
            print("availability:", transition.current, flush=True)


async def read_until_recovered(service: DmsService) -> tuple[int, int]:
    """Count valid and invalid messages until the model's outputs are valid again after the hang
    (the availability then says whether the host keeps up with the camera: on a busy one it may
    stay DEGRADED or UNAVAILABLE, ``overloaded``, the frames it publishes valid)."""
    valid = invalid = 0
    hung = False
    async for message in service.messages():
        if message.valid:
            valid += 1
        else:
            invalid += 1
        why = message.availability_reason_kind  # what the service's state is about
        if why == "gpu-queue" and not hung:  # the accelerator's queue made no progress
            hung = True
            print(f"message {message.seq}: {message.availability}, {why}")
        elif hung and message.valid:
            print(f"message {message.seq}: valid again, {message.availability}")
            break
    return valid, invalid


async def main() -> int:
    hang = FaultSpec("gpu-hang", start=30, frames=10)  # the text form: "gpu-hang@30+10"
    config = ServiceConfig(faults=(hang,), health_port=0)
    try:
        async with DmsService(config) as service:  # leaving the block stops the service
            for line in (await service.started()).lines():
                print(line)  # health: http://127.0.0.1:PORT/ (the port the system chose)
            watching = asyncio.create_task(print_transitions(service))
            try:
                async with asyncio.timeout(60):  # an application bounds what it waits for
                    valid, invalid = await read_until_recovered(service)
            finally:
                watching.cancel()
    except StartupError as exc:  # the only error starting raises; .setting names what to change
        print(f"the DMS service could not start: {exc} (setting: {exc.setting})", file=sys.stderr)
        return 2
    print(f"stopped; messages: {valid} valid, {invalid} invalid")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
