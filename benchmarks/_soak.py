"""The soak's fault driver and meters, beside a service and its simulated accelerator (the soak
itself, and what it reports: benchmarks/soak.py)."""

from __future__ import annotations

import ctypes
import gc
import math
import os
import random
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from aio_runtime import Availability, now
from pipelines.dms.config.faults import DEVICE_FAULTS
from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.synthetic import SyntheticCamera
from pipelines.dms.service import DmsService
from transports.gpu import SessionConfig
from transports.sim import FaultPlan, FaultRule
from transports.sim.gpu import SimGpu

DEVICE_KINDS = tuple(DEVICE_FAULTS)
SERVICE_KINDS = ("camera-stall", "nan-output")
HANG_BOUND = 1.0
"""Virtual seconds: a frame published older than this, or no frame published for this long while
frames arrive, is a hang (a frame's wait is bounded by its 50 ms budget)."""
RECOVERY_BOUND = 30.0
"""Virtual seconds after a cluster's end by which the service must be AVAILABLE again."""
TARGET = 1.0
MODE1_RESET = "SOC: mode-1 reset (firmware was running)"
PERIOD = 0.05
"""Seconds between frames of the synthetic camera (20 Hz)."""


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
