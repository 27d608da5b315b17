"""Embedding the DMS service in a trio application (the service runs on trio through anyio).

The application starts the service with its health endpoints on a port the system chooses and
learns which; a second service asked for that same port cannot start, and says so with a
:class:`StartupError` naming the setting. The first follows its availability transitions through
a camera stall scripted at frame 20 (10 frames without a picture), and stops the service once it
is available again.

    python examples/embed_trio.py
"""

from __future__ import annotations

import trio

from pipelines.dms import Availability, DmsService, FaultSpec, ServiceConfig, StartupError


async def main() -> None:
    stall = FaultSpec("camera-stall", start=20, frames=10)
    async with DmsService(ServiceConfig(faults=(stall,), health_port=0)) as service:
        bound = await service.started()
        print("health:", bound.health_url)
        try:
            async with DmsService(ServiceConfig(health_port=bound.health_port)):
                pass
        except StartupError as exc:
            print(f"a second service cannot start ({exc.setting}): {exc}")
        outage = False
        with trio.fail_after(60), service.transitions() as stream:
            async for transition in stream:
                state = transition.current
                print("availability:", state, flush=True)
                kind = state.reason.kind if state.reason is not None else None
                if state.availability is Availability.UNAVAILABLE and kind == "camera":
                    outage = True
                elif outage and state.availability is Availability.AVAILABLE:
                    break  # recovered: leaving the block stops the service
    print("stopped")


if __name__ == "__main__":
    trio.run(main)
