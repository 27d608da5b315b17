"""Soak: the DMS service on the simulated accelerator under random, overlapping faults, in virtual
time — far faster than real time — checking that nothing is lost, nothing hangs, nothing leaks.

The service runs as ``aio-dms run --device sim`` does, on the synthetic camera, with the model of
the same contract made cheap: the simulated GPU's kernel hands back the bundled reference
model's output for one frame, computed once (the warp, the copies over the simulated bridge, the
kernel, the timeline and the copy-out all run for every frame). Under
:func:`aio_runtime.testing.virtual_time` with ``hold=threads_busy()``, work on threads takes no
virtual time: every instant is set by the timers (see :data:`GRACE`).

Faults (seeded: ``--seed``): the accelerator's — gpu-hang, usb-timeout, usb-disconnect,
fence-stall, smu-timeout — in clusters of one to three overlapping kinds, each cluster once the
service is AVAILABLE again after the last one, plus as many more struck the moment a session
starts reopening (a kind not already active, the least struck first); and the service's own —
camera-stall and nan-output — scripted by frame number. Reported: frames received, valid,
invalid, dropped; unaccounted frames (received - published - dropped, published counted by a
subscriber of its own); hangs (a published frame older than ``HANG_BOUND`` seconds, no frame
published for that long while frames arrive, or the service not AVAILABLE again within
``RECOVERY_BOUND`` of a cluster's end); RSS, threads and file descriptors sampled every 1 % of
the run; per fault kind, fault -> UNAVAILABLE and end of fault -> AVAILABLE (virtual seconds;
the latter for each cluster, under the kind that ended last, with how many exceeded the target of
1 s plus the mode-1 reset pause where the recovering boot needed one).

Exit status 1 when unaccounted or hangs is not 0, RSS grew by more than 5 MB, or the file
descriptors or threads grew at all between 10 % and 100 % of the run. Final JSON line with
``frames``, ``unaccounted``, ``hangs``, ``rss_growth_mb``, ``fds_growth``, ``threads_growth``,
and the rest. ``--frames``: 5 000 by default (the form ``make bench`` runs); the long form is
``--frames 100000`` or more.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import ctypes
import gc
import json
import logging
import math
import os
import random
import statistics
import threading
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import numpy as np
import structlog

from aio_runtime import Availability, Ledger, now, use_ledger
from aio_runtime.testing import threads_busy, virtual_time
from pipelines.dms.accelerator_sim import simulated_device
from pipelines.dms.camera import Frame
from pipelines.dms.camera_synthetic import SyntheticCamera
from pipelines.dms.config import ServiceConfig
from pipelines.dms.faults import DEVICE_FAULTS
from pipelines.dms.model import load_contract
from pipelines.dms.model_runner import OnnxRunner
from pipelines.dms.reference_model import reference_model_path
from pipelines.dms.service import DmsService
from pipelines.dms.warp import MODEL_INPUT_SIZE
from transports.gpu import SessionConfig
from transports.sim import FaultPlan, FaultRule
from transports.sim.gpu import SimGpu
from transports.sim.usb import SimUsbTransport

DEVICE_KINDS = tuple(DEVICE_FAULTS)
SERVICE_KINDS = ("camera-stall", "nan-output")
HANG_BOUND = 1.0
"""Virtual seconds: a frame published older than this, or no frame published for this long while
frames arrive, is a hang (a frame's wait is bounded by its 50 ms budget)."""
RECOVERY_BOUND = 30.0
"""Virtual seconds after a cluster's end by which the service must be AVAILABLE again."""
TARGET = 1.0
MODE1_RESET = "SOC: mode-1 reset (firmware was running)"
GRACE = 0.001
"""Real seconds the loop waits for a thread's wake-up before a jump (see
tests/test_dms_service_virtual_time.py, which waits 5 ms: a soak makes hundreds of thousands of
jumps). A wake-up later than that (a loaded machine) is seen one jump late: the run is then not
the same as the last to the instant, though its faults come in the same order."""


def _trimmer() -> Callable[[], object]:
    """glibc's malloc_trim(0), where there is one: freed heap memory goes back to the system, so
    that RSS counts what is live rather than where the heap's top last stood (a frame's buffers
    are megabytes each)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    return lambda: trim(0)


_trim = _trimmer()


def process_sample() -> tuple[float, int, int]:
    """(RSS in MB, threads — native ones included —, open file descriptors) of this process,
    after a garbage collection and a heap trim."""
    gc.collect()
    _trim()
    with open("/proc/self/statm") as statm:
        rss_pages = int(statm.read().split()[1])
    rss = rss_pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    return rss, len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


@dataclass
class Latencies:
    """Per fault kind, in virtual seconds."""

    unavailable: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Fault -> UNAVAILABLE, for faults that struck a service that was not UNAVAILABLE."""
    available: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """End of fault -> AVAILABLE: for each cluster, under the kind that ended last."""
    over_target: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    struck: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    during_reopen: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    slow: list[str] = field(default_factory=list)
    """The first few recoveries over target, each with what happened before it."""


@dataclass
class SoakResult:
    frames: int
    received: int
    valid: int
    invalid: int
    dropped: int
    published: int
    hangs: int
    leaked: int
    """Ledger entries (transfers, threads, mappings) still live once the service had stopped."""
    samples: list[tuple[int, float, int, int]]
    """(frame, RSS MB, threads, fds) every 1 % of the run."""
    latencies: Latencies
    virtual_s: float
    real_s: float
    kept: dict[str, int] = field(default_factory=dict)
    """What the service's summary holds at the end (frame ages, availability transitions)."""

    @property
    def unaccounted(self) -> int:
        return self.received - self.published - self.dropped

    def growth(self, column: int) -> float:
        """Growth of a sample column (1 RSS, 2 threads, 3 fds) from 10 % of the run to its end."""
        if len(self.samples) < 2:
            return 0.0
        base = min(self.samples, key=lambda s: abs(s[0] - self.frames / 10))
        return self.samples[-1][column] - base[column]


def service_script(frames: int, rng: random.Random) -> str:
    """camera-stall and nan-output, by frame number: about one of each per 1 000 frames."""
    items, frame = [], 100
    while True:
        frame += rng.randint(250, 750)
        if frame >= frames - 100:
            return ",".join(items)
        kind = rng.choice(SERVICE_KINDS)
        length = rng.randint(2, 20) if kind == "camera-stall" else rng.randint(1, 15)
        items.append(f"{kind}@{frame}+{length}")


def cheap_infer(model: Path) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The reference model's output for a blank frame, computed once: a model of the same
    contract that costs nothing to run."""
    runner = OnnxRunner(model)
    try:
        output = runner.run_blocking(
            np.zeros((1, MODEL_INPUT_SIZE), np.uint8), np.zeros((1, 3), np.float32)
        )
    finally:
        runner.close()
    return lambda img, calib: output.copy()


class Soak:
    """One run: the fault driver and the meters, beside a service and its accelerator."""

    def __init__(self, frames: int, seed: int, *, progress: list[int] | None = None) -> None:
        self.frames = frames
        self.progress = progress if progress is not None else [0]
        self.rng = random.Random(seed)
        self.script = service_script(frames, self.rng)
        self.lat = Latencies()
        self.hangs = 0
        self.published = 0
        self.arrived = 0
        self.samples: list[tuple[int, float, int, int]] = []
        self.service: DmsService | None = None
        self.plan: FaultPlan | None = None
        self.gpu: SimGpu | None = None
        self.state = Availability.UNAVAILABLE
        self.available_since = 0.0
        self.changed = anyio.Event()
        self.active: set[str] = set()
        """Faults active now (the accelerator's and the service's)."""
        self.starts = 0
        """Faults started so far."""
        self.service_starts = 0
        """The service's own faults started so far."""
        self._cluster: anyio.abc.TaskGroup | None = None
        self._scheduled = 0
        self._last_end: tuple[str, float, int] = ("", 0.0, 0)
        """The cluster's fault that ended last: its kind, when, and how many of the service's
        own faults had started then (-1: one was active)."""
        self._awaiting_unavailable: list[tuple[str, float, float]] = []
        self._last_published = 0.0
        self._stalled_until = 0.0
        self._events: deque[tuple[float, str]] = deque(maxlen=200)
        """The latest faults and transitions, for the story of a slow recovery."""

    def _notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    # -- meters --------------------------------------------------------------------------------

    async def camera(self, tg: anyio.abc.TaskGroup) -> AsyncIterator[Frame]:
        """The synthetic camera, sampling the process every 1 % of the run and playing the
        service's scripted faults' bookkeeping as their frames arrive."""
        assert self.service is not None
        step = max(1, self.frames // 100)
        starts = {spec.start: spec for spec in self.service.config.faults}
        ends = {spec.start + spec.frames: spec for spec in self.service.config.faults}
        async for frame in SyntheticCamera():
            number = self.arrived
            if number % step == 0:
                self._forget_simulator_records()
                self.samples.append((number, *process_sample()))
            if number in ends:
                self.active.discard(ends[number].name)
                tg.start_soon(self._service_recovery, ends[number].name, now())
            if number in starts:
                spec = starts[number]
                self.service_starts += 1
                self._struck(spec.name, spec.frames * PERIOD)
            self.arrived += 1
            self.progress[0] = self.arrived
            yield frame

    def _forget_simulator_records(self) -> None:
        """The simulator keeps a record of what it did — every firing of a fault, every SMU
        message — for tests' assertions. It stands for hardware, which keeps no such thing:
        dropped as the process is sampled, so that the RSS measured is the service's."""
        assert self.plan is not None and self.gpu is not None
        self.plan.fired.clear()
        self.gpu.smu.messages.clear()

    async def follow_messages(self) -> None:
        assert self.service is not None
        seq = -1
        async for message in self.service.messages(backlog=100_000):
            if message.seq != seq + 1:
                raise AssertionError(f"the soak missed messages {seq + 1}..{message.seq - 1}")
            seq = message.seq
            if message.frame_id < 0:  # a status message (the camera is out): no frame
                continue
            t = now()
            self.published += 1
            if message.frame_age > HANG_BOUND:
                self.hangs += 1
            quiet = t - self._last_published
            if self._last_published and quiet > HANG_BOUND and t > self._stalled_until + HANG_BOUND:
                self.hangs += 1
            self._last_published = t

    async def follow_availability(self) -> None:
        assert self.service is not None
        with self.service.transitions() as transitions:
            async for transition in transitions:
                current = transition.current
                self._events.append((current.since, f"{current}"[:160]))
                self.state = current.availability
                if self.state is Availability.AVAILABLE:
                    self.available_since = current.since
                elif self.state is Availability.UNAVAILABLE:
                    for kind, start, by in self._awaiting_unavailable:
                        if current.since <= by:
                            self.lat.unavailable[kind].append(current.since - start)
                    self._awaiting_unavailable.clear()
                detail = "" if current.reason is None else current.reason.detail
                if detail.startswith("opening session"):
                    self._strike_reopen()
                self._notify()

    def _struck(self, kind: str, duration: float) -> None:
        self.starts += 1
        self.active.add(kind)
        self.lat.struck[kind] += 1
        t = now()
        if self.state is not Availability.UNAVAILABLE:
            self._awaiting_unavailable.append((kind, t, t + duration + 1.0))
        if kind == "camera-stall":
            self._stalled_until = max(self._stalled_until, t + duration)

    def _reopening(self) -> bool:
        assert self.service is not None
        reason = self.service.availability.state.reason
        return self.service.device.current is None and (
            reason is not None and reason.detail.startswith("opening session")
        )

    async def _until_available(self, bound: float) -> float | None:
        """When the service is next AVAILABLE (its transition's time), within ``bound``."""
        with anyio.move_on_after(bound):
            while self.state is not Availability.AVAILABLE:
                await self.changed.wait()
            return self.available_since
        return None

    async def _service_recovery(self, kind: str, ended: float) -> None:
        """End of a service fault -> AVAILABLE, if no other fault is in the way."""
        if self.active or self._scheduled:
            return
        starts = self.starts
        back = await self._until_available(RECOVERY_BOUND)
        if back is None:
            self.hangs += 1
        elif self.starts == starts:
            self._recovered(kind, ended, back, pause=0.0)

    def _recovered(self, kind: str, ended: float, back: float, *, pause: float) -> None:
        latency = max(0.0, back - ended)
        self.lat.available[kind].append(latency)
        if latency > TARGET + pause + 1e-6:
            self.lat.over_target[kind] += 1
            if len(self.lat.slow) < 5:
                story = [f"{t - ended:+8.3f} {what}" for t, what in self._events if t >= ended - 3]
                self.lat.slow.append(
                    f"{kind}: AVAILABLE {latency:.3f} s after the end (mode-1 pause {pause} s)\n"
                    + "\n".join(story)
                )

    # -- the fault driver ----------------------------------------------------------------------

    async def _fault(self, kind: str, delay: float, duration: float) -> None:
        assert self.plan is not None
        try:
            await anyio.sleep(delay)
            if kind in self.active:
                return
            reopening = self._reopening()
            if reopening:
                self.lat.during_reopen[kind] += 1
            self.plan.add(FaultRule(DEVICE_FAULTS[kind], at=1, count=math.inf))
            self._struck(kind, duration)
            self._events.append((now(), f"{kind} for {duration:.3f} s{' (reopening)' * reopening}"))
            await anyio.sleep(duration)
            self.plan.clear(DEVICE_FAULTS[kind])
            self.active.discard(kind)
            clean = not set(SERVICE_KINDS) & self.active
            self._last_end = (kind, now(), self.service_starts if clean else -1)
            self._events.append((now(), f"{kind} ends"))
        finally:
            self._scheduled -= 1
            self._notify()

    def _schedule(self, kind: str, delay: float, duration: float) -> None:
        assert self._cluster is not None
        self._scheduled += 1
        self._cluster.start_soon(self._fault, kind, delay, duration)

    def _strike_reopen(self) -> None:
        """A session starts reopening while a cluster runs: strike it, now and then, with a kind
        not active (the one struck during a reopen the fewest times so far)."""
        if self._cluster is None or self.rng.random() > 0.3:
            return
        idle = [kind for kind in DEVICE_KINDS if kind not in self.active]
        if idle:
            kind = min(idle, key=lambda k: (self.lat.during_reopen[k], self.rng.random()))
            self._schedule(kind, 0.0, self.rng.uniform(0.05, 0.6))

    async def drive(self) -> None:
        """Clusters of faults, each once the service is AVAILABLE again after the last."""
        assert self.service is not None
        await self._until_available(RECOVERY_BOUND)
        while True:
            await anyio.sleep(self.rng.uniform(1.0, 2.0))  # AVAILABLE, quiet
            async with anyio.create_task_group() as cluster:
                self._cluster = cluster
                for kind in self.rng.sample(DEVICE_KINDS, self.rng.choice((1, 1, 2, 3))):
                    self._schedule(kind, self.rng.uniform(0, 0.3), self.rng.uniform(0.1, 1.5))
                with anyio.move_on_after(RECOVERY_BOUND * 4) as bounded:
                    while self._scheduled or self.state is not Availability.AVAILABLE:
                        await self.changed.wait()
                self._cluster = None
            if bounded.cancelled_caught:
                self.hangs += 1
                continue
            kind, ended, service_starts = self._last_end
            if self.service_starts != service_starts or set(SERVICE_KINDS) & self.active:
                continue  # a camera stall or NaN output of the script's was in the way
            session = self.service.device.current
            steps = [] if session is None else session.backend.runner.session.boot_log.steps
            pause = SessionConfig().mode1_reset_pause if MODE1_RESET in steps else 0.0
            self._recovered(kind, ended, self.available_since, pause=pause)


PERIOD = 0.05
"""Seconds between frames of the synthetic camera (20 Hz)."""


async def run_soak(frames: int, seed: int, *, progress: list[int] | None = None) -> SoakResult:
    """Run the service for ``frames`` frames under the seeded faults; what was found.
    ``progress[0]``, if given, follows the frames that have arrived."""
    model = reference_model_path()
    contract = load_contract(model)
    infer = cheap_infer(model)
    soak = Soak(frames, seed, progress=progress)
    config = ServiceConfig(
        device="sim", health_port=None, calib=(0.0, 0.0, 0.0), frames=frames, faults=soak.script
    )
    real_start = time.perf_counter()
    ledger = Ledger()
    with use_ledger(ledger):
        async with virtual_time(autojump_threshold=GRACE, hold=threads_busy(ledger)) as clock:
            start = clock.now()
            soak.plan = FaultPlan()
            async with simulated_device(
                infer,
                image_size=MODEL_INPUT_SIZE,
                output_size=contract.output_length,
                plan=soak.plan,
            ) as sim:
                soak.gpu = sim.gpu

                async def transport() -> SimUsbTransport:
                    return SimUsbTransport(sim.bridge)

                async with anyio.create_task_group() as meters:
                    soak.service = DmsService(
                        config, source=soak.camera(meters), transport=transport
                    )
                    async with soak.service as service:
                        meters.start_soon(soak.follow_messages)
                        meters.start_soon(soak.follow_availability)
                        meters.start_soon(soak.drive)
                        await service.finished()
                        meters.cancel_scope.cancel()
            virtual = clock.now() - start
    counts = soak.service.summary.frames
    return SoakResult(
        frames=frames,
        received=counts.received,
        valid=counts.valid,
        invalid=sum(counts.invalid.values()),
        dropped=sum(counts.dropped.values()),
        published=soak.published,
        hangs=soak.hangs,
        leaked=len(ledger.live()),
        samples=soak.samples,
        latencies=soak.lat,
        virtual_s=virtual,
        real_s=time.perf_counter() - real_start,
        kept={
            "frame_ages": len(soak.service.summary.frame_ages),
            "transitions": len(soak.service.summary.transitions),
        },
    )


def _quantiles(values: list[float]) -> str:
    if not values:
        return f"{'-':>7} {'-':>7} {'-':>7}"
    return f"{statistics.median(values):7.3f} {np.percentile(values, 99):7.3f} {max(values):7.3f}"


def report(result: SoakResult) -> dict[str, Any]:
    """Print the table; the final JSON line's content."""
    lat = result.latencies
    print(
        f"soak: {result.frames} frames, {result.virtual_s:.0f} s of virtual time in "
        f"{result.real_s:.0f} s ({result.frames / result.real_s:.0f} frames/s, "
        f"{result.virtual_s / result.real_s:.1f}x real time)"
    )
    print(
        f"frames: received {result.received}, valid {result.valid}, invalid {result.invalid}, "
        f"dropped {result.dropped}, published {result.published}; "
        f"unaccounted {result.unaccounted}; hangs {result.hangs}; leaked {result.leaked}"
    )
    print(
        f"{'fault':<15} {'struck':>6} {'reopen':>6}  {'-> unavailable (s) p50 p99 max':>31}"
        f"  {'end -> available (s) p50 p99 max':>33} {'n':>4} {'over':>4}"
    )
    for kind in (*DEVICE_KINDS, *SERVICE_KINDS):
        print(
            f"{kind:<15} {lat.struck[kind]:6d} {lat.during_reopen[kind]:6d}  "
            f"{_quantiles(lat.unavailable[kind]):>31}  {_quantiles(lat.available[kind]):>33} "
            f"{len(lat.available[kind]):4d} {lat.over_target[kind]:4d}"
        )
    for story in lat.slow:
        print(f"slow recovery, {story}")
    first = min(result.samples, key=lambda s: abs(s[0] - result.frames / 10))
    last = result.samples[-1]
    print(
        f"process at 10 % / end: RSS {first[1]:.1f} / {last[1]:.1f} MB, threads {first[2]} / "
        f"{last[2]}, fds {first[3]} / {last[3]}; the service's summary keeps "
        f"{result.kept.get('frame_ages', 0)} frame ages (bounded) and "
        f"{result.kept.get('transitions', 0)} availability transitions"
    )

    def stats(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
        return {
            kind: {"median": statistics.median(v), "max": max(v), "n": len(v)}
            for kind, v in values.items()
            if v
        }

    return {
        "frames": result.frames,
        "received": result.received,
        "valid": result.valid,
        "invalid": result.invalid,
        "dropped": result.dropped,
        "published": result.published,
        "unaccounted": result.unaccounted,
        "hangs": result.hangs,
        "leaked": result.leaked,
        "rss_growth_mb": round(result.growth(1), 2),
        "threads_growth": int(result.growth(2)),
        "fds_growth": int(result.growth(3)),
        "virtual_s": round(result.virtual_s, 1),
        "real_s": round(result.real_s, 1),
        "frames_per_s": round(result.frames / result.real_s, 1),
        "struck": dict(lat.struck),
        "struck_during_reopen": dict(lat.during_reopen),
        "fault_to_unavailable_s": stats(lat.unavailable),
        "end_to_available_s": stats(lat.available),
        "recoveries_over_target": dict(lat.over_target),
        "summary_kept": result.kept,
    }


def failures(summary: dict[str, Any]) -> list[str]:
    """Why the run failed (empty: it passed)."""
    problems = [
        f"{key} = {summary[key]}" for key in ("unaccounted", "hangs", "leaked") if summary[key]
    ]
    if summary["rss_growth_mb"] > 5:
        problems.append(f"RSS grew {summary['rss_growth_mb']} MB (over 5 MB)")
    problems += [
        f"{key} = {summary[key]}" for key in ("fds_growth", "threads_growth") if summary[key] > 0
    ]
    return problems


def _watchdog(soak_progress: Callable[[], int], limit: float) -> None:
    """Ends the process if the run stops making progress in real time (a hang the service's
    own clock cannot see: the loop itself stuck)."""
    seen, since = -1, time.monotonic()
    while True:
        time.sleep(1.0)
        progress = soak_progress()
        if progress != seen:
            seen, since = progress, time.monotonic()
        elif time.monotonic() - since > limit:
            print(f"soak: no progress for {limit:.0f} s of real time: hung", file=sys.stderr)
            print(json.dumps({"frames": progress, "hangs": 1}))
            os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=5_000, help="frames (long form: 100000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the faults (default 1)")
    parser.add_argument(
        "--stall-limit", type=float, default=120.0, help="real seconds without progress: hung"
    )
    args = parser.parse_args(argv)
    if args.frames < 500:
        parser.error("--frames must be at least 500")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    progress = [0]
    threading.Thread(
        target=_watchdog, args=(lambda: progress[0], args.stall_limit), daemon=True
    ).start()

    async def run() -> SoakResult:
        return await run_soak(args.frames, args.seed, progress=progress)

    summary = report(anyio.run(run))
    problems = failures(summary)
    for problem in problems:
        print(f"FAILED: {problem}")
    print(json.dumps(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
