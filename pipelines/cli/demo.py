"""A short, real demonstration of the runtime core (what ``aio-dms demo`` runs).

A device (a background thread that stores completion values into shared memory, as a GPU would)
runs frames under a supervisor:

1. session 1 boots through a firmware mailbox, completes frames (the waits detect the device's
   plain memory stores), becomes AVAILABLE — then the device hangs: the timeline wait times out
   with a typed error and availability goes UNAVAILABLE with the reason;
2. session 2's firmware never answers its boot message: the mailbox times out, UNAVAILABLE again;
3. session 3 boots and runs until enough good frames make it AVAILABLE again, and the demo ends.

Nothing is left allocated: the ledger is checked at the end. Takes about a second of real time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio
import numpy as np

from aio_runtime import (
    Availability,
    AvailabilityMachine,
    Backoff,
    Ledger,
    Mailbox,
    MailboxLayout,
    MemoryWatcher,
    RangeAllocator,
    Stages,
    Supervisor,
    TimelineSignal,
    configure_logging,
    deadline_scope,
    get_logger,
    log_context,
    use_ledger,
)
from aio_runtime.testing import Reply, ScriptedFirmware

from ..exit_codes import stopped_exit_code
from ..stopping import Stopping

__all__ = ["DemoDevice", "Plan", "Session", "add_arguments", "main", "run_demo"]

_log = get_logger(__name__)

SMU = MailboxLayout(message=66, argument=82, response=90)
ENABLE_ALL_FEATURES = 0x06
FRAME_BUDGET_S = 0.050
SIGNAL_TIMEOUT_S = 0.030
FIRMWARE_TIMEOUT_S = 0.200
DEVICE_LATENCY_S = 0.004


class DemoDevice:
    """Completes each submitted job by storing its timeline value from another thread, unless hung."""

    def __init__(self, memory: np.ndarray, hang_after: int | None) -> None:
        self.memory = memory
        self.hang_after = hang_after
        self.completed = 0
        self._timers: list[threading.Timer] = []

    def submit(self, value: int) -> None:
        if self.hang_after is not None and self.completed >= self.hang_after:
            return  # hung: the store never comes
        self.completed += 1
        timer = threading.Timer(DEVICE_LATENCY_S, self.memory.__setitem__, args=(0, value))
        self._timers.append(timer)
        timer.start()

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()


@dataclass
class Session:
    device: DemoDevice
    signal: TimelineSignal
    frames_left: int
    timeline: int = 0


@dataclass
class Plan:
    """What each session attempt does: (firmware answers?, frames before the device hangs)."""

    attempts: list[tuple[bool, int | None]] = field(
        default_factory=lambda: [(True, 4), (False, None), (True, None)]
    )
    frames_to_finish: int = 5


async def run_demo() -> int:
    configure_logging("console")
    availability = AvailabilityMachine(recover_after=3)
    ledger = Ledger()
    plan = Plan()
    watcher = MemoryWatcher("demo-device")
    signal_pages = RangeAllocator(4096, name="signal page", ledger=ledger)
    attempt = 0

    @contextlib.asynccontextmanager
    async def open_session() -> AsyncIterator[Session]:
        nonlocal attempt
        firmware_answers, hang_after = plan.attempts[min(attempt, len(plan.attempts) - 1)]
        attempt += 1
        async with Stages(f"session {attempt}", ledger=ledger) as stages:
            slot = await stages.acquire(
                lambda: signal_pages.alloc(16, align=16), signal_pages.free, label="signal slot"
            )
            memory = np.zeros(2, dtype=np.uint64)
            device = DemoDevice(memory, hang_after)
            stages.add(device.stop, label="device")
            firmware = ScriptedFirmware(
                SMU, default=Reply() if firmware_answers else ScriptedFirmware.never()
            )
            smu = Mailbox(
                firmware,
                SMU,
                name="SMU",
                timeout=FIRMWARE_TIMEOUT_S,
                codes={1: "OK", 0xFF: "failed"},
            )
            await smu.send(ENABLE_ALL_FEATURES)
            _log.info("firmware ready", slot=str(slot))
            signal = TimelineSignal(
                memory, name=f"device timeline (session {attempt})", watcher=watcher
            )
            yield Session(device, signal, plan.frames_to_finish)

    async def run_session(session: Session) -> None:
        frame = 0
        while session.frames_left > 0:
            frame += 1
            session.timeline += 1
            with (
                log_context(frame_id=frame, stage="device"),
                deadline_scope(FRAME_BUDGET_S, name=f"frame {frame}"),
            ):
                session.device.submit(session.timeline)
                observed = await session.signal.wait(session.timeline, timeout=SIGNAL_TIMEOUT_S)
            _log.info("frame complete", frame_id=frame, timeline=observed)
            availability.report_good()
            if availability.state.availability is Availability.AVAILABLE:
                session.frames_left -= 1

    supervisor = Supervisor(
        "demo device",
        open_session,
        run_session,
        availability=availability,
        backoff=Backoff(initial=0.05, cap=0.2),
    )
    transitions: list[str] = []

    async def watch_availability() -> None:
        with availability.subscribe() as stream:
            async for transition in stream:
                transitions.append(str(transition.current))
                print(f"availability -> {transition.current}", flush=True)

    with watcher, use_ledger(ledger):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_availability)
            await supervisor.run()
            tg.cancel_scope.cancel()

    stats = supervisor.statistics()
    ledger.assert_empty()
    print(
        f"demo done: {stats.attempts} session attempts, {stats.failures} failures, "
        f"{len(transitions)} availability states, nothing left allocated",
        flush=True,
    )
    return 0 if availability.state.availability is Availability.AVAILABLE else 1


def add_arguments(parser: argparse.ArgumentParser, command: str = "demo") -> None:
    """``aio-dms demo`` takes no options."""


def main(args: argparse.Namespace | None = None, stopping: Stopping | None = None) -> int:
    """The demonstration's exit code; stopped by a signal (through ``stopping``, the command
    line's), it ends at once: exit code 130."""
    if stopping is None:
        return anyio.run(run_demo)
    return anyio.run(_stoppable, stopping)


async def _stoppable(stopping: Stopping) -> int:
    loop = asyncio.get_running_loop()  # the command line runs on asyncio
    scope = anyio.CancelScope()

    def stop() -> None:
        loop.call_soon_threadsafe(scope.cancel)

    with stopping.calling(stop), scope:
        return await run_demo()
    print("aio-dms demo: stopped by a signal", file=sys.stderr)
    return stopped_exit_code("demo")
