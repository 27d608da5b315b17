"""Benchmark: how fast the DMS service comes back from each kind of fault, in real time.

The service runs as ``aio-dms run --device sim`` does (the simulated accelerator in this process,
the bundled reference model on onnxruntime, the synthetic camera at 20 Hz), on the wall clock.
Each fault kind is played ``--trials`` times (default 10), one trial at a time, each once the
service has been AVAILABLE for a quiet second:

* the accelerator's faults (gpu-hang, usb-timeout, usb-disconnect, fence-stall) last
  ``--duration`` seconds (default 0.5), put into and taken out of the simulator's fault plan;
* smu-timeout shows only when a session boots: a 0.1 s gpu-hang makes the session restart, and
  the SMU is silent from 0.05 s into the hang for ``--duration`` seconds, across the reboot;
* the service's own faults (camera-stall, nan-output) last ``--duration`` worth of frames,
  scripted by frame number before the run (so they come first, one every 3 s).

Reported per kind: fault -> UNAVAILABLE (from the fault's start; smu-timeout: from the hang's)
and end of fault -> AVAILABLE (from its end: the simulator's rule cleared, or the fault's last
frame passed), median and max, real seconds. Target: end of fault -> AVAILABLE within 1 s, plus
the 0.5 s mode-1 reset pause where the boot that recovers needs one. On this shared, noisy
machine quote medians. Final JSON line: per kind ``{"unavailable": {...}, "available": {...}}``. A
trial that fails (the service not UNAVAILABLE, or not AVAILABLE again, within its bound) is
reported and the others go on, see :mod:`benchmarks._report`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import math
import statistics
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable

import anyio

from aio_runtime import Availability, now
from benchmarks._report import Report, run
from pipelines.dms.config.faults import DEVICE_FAULTS
from pipelines.dms.config.settings import ServiceConfig
from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.service import DmsService
from transports.sim import FaultPlan, FaultRule

PERIOD = 0.05
DEVICE_KINDS = ("gpu-hang", "usb-timeout", "usb-disconnect", "fence-stall")
SERVICE_KINDS = ("camera-stall", "nan-output")
KINDS = (*DEVICE_KINDS, "smu-timeout", *SERVICE_KINDS)
SERVICE_SPACING = 60
"""Frames between the service's own scripted faults (3 s: each has recovered before the next)."""
BOUND = 60.0
"""Real seconds within which the service must be UNAVAILABLE, then AVAILABLE, in each trial."""


class Trials:
    """The times the service changed availability, and the trials played on it."""

    def __init__(self) -> None:
        self.service: DmsService | None = None
        self.plan: FaultPlan | None = None
        self.arrived: list[float] = []
        self.changes: list[tuple[float, Availability]] = []
        self.changed = anyio.Event()
        self.frame = anyio.Event()
        """Set (and renewed) as each frame arrives."""
        self.unavailable: dict[str, list[float]] = defaultdict(list)
        self.available: dict[str, list[float]] = defaultdict(list)

    async def camera(self) -> AsyncIterator[Frame]:
        async for frame in SyntheticCamera():
            self.arrived.append(now())
            self.frame.set()
            self.frame = anyio.Event()
            yield frame

    async def frames(self, count: int) -> None:
        """Until ``count`` frames have arrived (within their period each and BOUND)."""
        with anyio.fail_after(BOUND + count * PERIOD):
            while len(self.arrived) < count:
                await self.frame.wait()

    async def follow(self) -> None:
        assert self.service is not None
        with self.service.transitions() as transitions:
            async for transition in transitions:
                current = transition.current
                self.changes.append((current.since, current.availability))
                self.changed.set()
                self.changed = anyio.Event()

    def _first(self, availability: Availability, after: float) -> float | None:
        return next((t for t, a in self.changes if a is availability and t >= after), None)

    async def _until(self, availability: Availability, after: float) -> float:
        with anyio.fail_after(BOUND):
            while (t := self._first(availability, after)) is None:
                await self.changed.wait()
        return t

    async def quiet(self) -> None:
        """Until the service is AVAILABLE, and was not UNAVAILABLE in the last second (a frame
        over its budget on a loaded machine may make it DEGRADED meanwhile)."""
        with anyio.fail_after(BOUND):
            while True:
                t = now()
                down = [since for since, a in self.changes if a is Availability.UNAVAILABLE]
                recent = down[-1] if down else -math.inf
                if self.changes[-1][1] is Availability.AVAILABLE and t - recent >= 1.0:
                    return
                with anyio.move_on_after(max(0.05, 1.0 - (t - recent))):
                    await self.changed.wait()

    def record(self, kind: str, start: float, end: float) -> None:
        """A trial of ``kind`` from ``start`` to ``end``: when the service was UNAVAILABLE (if it
        was, by a second after the end) and AVAILABLE again."""
        unavailable = self._first(Availability.UNAVAILABLE, start)
        if unavailable is not None and unavailable <= end + 1.0:
            self.unavailable[kind].append(unavailable - start)
        available = self._first(Availability.AVAILABLE, end)
        if available is None:
            raise RuntimeError(f"{kind}: not AVAILABLE again after the fault ended")
        self.available[kind].append(available - end)

    async def device_trial(self, kind: str, duration: float) -> None:
        assert self.plan is not None
        await self.quiet()
        start = now()
        self.plan.add(FaultRule(DEVICE_FAULTS[kind], at=1, count=math.inf))
        await anyio.sleep(duration)
        self.plan.clear(DEVICE_FAULTS[kind])
        end = now()
        await self._until(Availability.AVAILABLE, end)
        self.record(kind, start, end)

    async def smu_trial(self, duration: float) -> None:
        """A 0.1 s gpu-hang, and the SMU silent from 0.05 s into it for ``duration``."""
        assert self.plan is not None
        hang, smu = DEVICE_FAULTS["gpu-hang"], DEVICE_FAULTS["smu-timeout"]
        await self.quiet()
        start = now()
        self.plan.add(FaultRule(hang, at=1, count=math.inf))
        await anyio.sleep(0.05)
        self.plan.add(FaultRule(smu, at=1, count=math.inf))
        await anyio.sleep(0.05)
        self.plan.clear(hang)
        await anyio.sleep(duration - 0.05)
        self.plan.clear(smu)
        end = now()
        await self._until(Availability.AVAILABLE, end)
        self.record("smu-timeout", start, end)


def service_script(trials: int, duration: float) -> list[tuple[str, int, int]]:
    """(kind, first frame, frames) of the service's own faults, one every SERVICE_SPACING."""
    frames = max(1, round(duration / PERIOD))
    kinds = [kind for _ in range(trials) for kind in SERVICE_KINDS]
    return [(kind, 60 + i * SERVICE_SPACING, frames) for i, kind in enumerate(kinds)]


async def measure(report: Report, trials: int, duration: float) -> Trials:
    script = service_script(trials, duration)
    config = ServiceConfig(
        device="sim",
        health_port=None,
        calib=(0.0, 0.0, 0.0),
        faults=",".join(f"{kind}@{first}+{frames}" for kind, first, frames in script),
    )
    bench = Trials()
    bench.service = service = DmsService(config, source=bench.camera())
    bench.plan = service.device.plan  # the simulated accelerator's, in this process
    async with service, anyio.create_task_group() as tg:
        tg.start_soon(bench.follow)
        try:
            await bench.frames(script[-1][1] + script[-1][2] + SERVICE_SPACING + 1)  # their faults
        except TimeoutError:
            report.fail("the service's own faults", f"the frames stopped at {len(bench.arrived)}")
        for number, (kind, first, frames) in enumerate(script):
            if first + frames < len(bench.arrived):  # its frames came
                start, end = bench.arrived[first], bench.arrived[first + frames]
                what = f"{kind} trial {number // len(SERVICE_KINDS) + 1}"
                try:
                    bench.record(kind, start, end)
                except RuntimeError as exc:  # not AVAILABLE again
                    report.fail(what, str(exc))
        for kind in DEVICE_KINDS:
            for number in range(trials):
                trial = bench.device_trial(kind, duration)
                await _trial(report, f"{kind} trial {number + 1}", trial)
        for number in range(trials):
            await _trial(report, f"smu-timeout trial {number + 1}", bench.smu_trial(duration))
        tg.cancel_scope.cancel()
    return bench


async def _trial(report: Report, what: str, trial: Awaitable[None]) -> None:
    """One trial; one that fails is reported, and the next begins."""
    try:
        await trial
    except Exception as exc:
        report.fail(what, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "median": round(statistics.median(values), 4),
        "max": round(max(values), 4),
        "n": len(values),
    }


def _cells(values: list[float]) -> str:
    if not values:
        return "-       -"
    return f"{statistics.median(values):.3f} {max(values):7.3f} ({len(values)})"


def main(report: Report, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="trials per fault kind")
    parser.add_argument("--duration", type=float, default=0.5, help="seconds each fault lasts")
    args = parser.parse_args(argv)
    if args.trials < 1 or not 0.1 < args.duration <= 5:
        parser.error("--trials must be >= 1 and --duration in (0.1, 5] seconds")
    bench = report.attempt("the service", anyio.run, measure, report, args.trials, args.duration)
    bench = bench or Trials()
    print(f"recovery, real time: {args.trials} trials per kind, faults of {args.duration} s")
    print(
        f"{'fault':<15} {'-> unavailable (s) median max':>30}  {'end -> available (s) median max':>32}"
    )
    summary = {}
    for kind in KINDS:
        down, up = bench.unavailable[kind], bench.available[kind]
        print(f"{kind:<15} {_cells(down):>30}  {_cells(up):>32}")
        summary[kind] = {"unavailable": _stats(down), "available": _stats(up)}
    report.end(summary)
    return 0


if __name__ == "__main__":
    run(main)
