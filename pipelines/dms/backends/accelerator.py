"""The model on an accelerator: a GPU behind a USB-PCIe bridge, reached through ``transports``
over any USB transport (libusb, pyusb, the simulator's).

Per frame: copy the inputs in (the warped image and the calibration, laid back to back in one
buffer, in one copy through the copy protocol), run the model as a device kernel
(:data:`MODEL_KERNEL`) with the copy-out of its output queued behind it on the device (the output
arriving is the kernel's completion) — each phase timed on its own (:class:`PhaseTimes`). Buffers
are allocated once per session; the output is copied out into a fresh array, so nothing the
caller keeps is reused by the next frame. The simulated GPU that can
run the model is in :mod:`pipelines.dms.backends.sim`.

While a run is in progress the runner looks at the device (:class:`StallEvidence`): how a hung
device — one that makes no progress — is told from a slow one, and from a host too busy to look
or, for the simulated GPU whose kernel is a thread of this process, too busy to run it: time the
event loop was late to look and time the runtime's worker threads waited for a CPU
(:class:`~aio_runtime.Starvation`) are no evidence.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass

import anyio
import numpy as np

from aio_runtime import (
    BudgetExhausted,
    DeviceLost,
    HardwareTimeout,
    Layer,
    Readiness,
    RuntimeFault,
    SignalTimeout,
    Starvation,
    current_deadline,
    deadline_scope,
    now,
    wait_complete,
)
from transports.errors import GpuFault
from transports.gpu import Buffer, GpuSession, SessionConfig, bridge_answers
from transports.usb import UsbTransport

from ..config.settings import ServiceConfig
from ..model.contract import ModelContract
from ..model.warp import MODEL_INPUT_SIZE
from .base import Device, Inference, ModelBackend
from .link import AcceleratorLink, LentTransport, TransportOpener

__all__ = [
    "LOOKS_PER_HANG",
    "MODEL_KERNEL",
    "AcceleratorBackend",
    "AcceleratorRunner",
    "PhaseTimes",
    "StallEvidence",
    "open_accelerator",
]

MODEL_KERNEL = 0x100
"""The kernel that runs the model: ``(image, calib, output)`` buffer addresses."""
_CALIB_BYTES = 16
"""Room for the calibration (three float32) after the image."""

LOOKS_PER_HANG = 4
"""How often a run in progress is looked at within its hang bound (the ``timeout`` of
:meth:`AcceleratorRunner.run`)."""
_RESOLUTION = 1e-9
"""Seconds within which evidence of no progress reaches the hang bound: the evidence is a sum of
intervals of the loop clock, which rounds."""


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds spent in each phase of one run."""

    copy_in: float
    submit: float
    device: float
    """From the doorbell until the output is on the host: the kernel, then the copy-out the
    device runs behind it."""

    @property
    def total(self) -> float:
        return self.copy_in + self.submit + self.device


class StallEvidence:
    """What the host has seen of a device making no progress.

    The host *observes* the device: it sees a step finish (:meth:`progressed`, with the progress
    state it then knows), or it *looks* at the device's progress state (:meth:`looked`). The
    evidence (:attr:`stalled`) is the time between observations that found the same state —
    less the time the host itself was late to look (its event loop, or the threads that
    simulate a device, not scheduled: no evidence against the device) — once the host has looked
    at least twice since the device last made progress. Time in which nobody looked
    (:meth:`paused`) is no evidence either. Plain bookkeeping: no clock, no I/O.
    """

    def __init__(self) -> None:
        self._state: Hashable = None
        self._at: float | None = None
        self._stalled = 0.0
        self.looks = 0
        """Looks since the device last made progress."""

    @property
    def stalled(self) -> float:
        """Seconds the device has been seen to make no progress (0 before two looks)."""
        return self._stalled if self.looks >= 2 else 0.0

    def progressed(self, at: float, state: Hashable) -> None:
        """The device was seen to reach ``state`` at ``at``: the evidence starts again."""
        self._state, self._at, self._stalled, self.looks = state, at, 0.0, 0

    def looked(self, at: float, state: Hashable | None = None, *, late: float = 0.0) -> None:
        """A look at ``at`` found ``state`` (None: the device did not answer, which is no
        progress); ``late``: seconds since the last observation that the host was late. A
        state other than the last one seen is progress."""
        if self._at is None or (state is not None and state != self._state):
            self.progressed(at, self._state if state is None else state)
            return
        self._stalled += max(0.0, at - self._at - late)
        self._at = max(self._at, at)
        self.looks += 1

    def paused(self, at: float) -> None:
        """Nobody looked from the last observation until ``at``: that time is no evidence."""
        if self._at is not None:
            self._at = max(self._at, at)


class AcceleratorRunner:
    """One open accelerator session, ready to run the model."""

    def __init__(self, session: GpuSession, *, image_size: int, output_size: int) -> None:
        self.session = session
        self.image_size = image_size
        self.output_size = output_size
        self._buffers: tuple[Buffer, Buffer] | None = None
        """The inputs (the image, then the calibration) and the output."""
        self._owed = False
        """The device owes a run it has not finished (one in progress, or one that failed)."""
        self._steps = 0
        """Steps of runs the device has finished (copies, kernels): its progress, as the host
        sees it finish."""
        self._timeline = (session.timeline.next_value - 1) & 0xFFFF_FFFF
        """The compute timeline as last seen (from the start: where the last kernel issued left
        it)."""
        self._evidence = StallEvidence()
        self._starvation = Starvation()
        """How long the runtime's threads (the simulated GPU's kernel among them) waited for a
        CPU between looks: time in which the host, not the device, could not run."""
        self._looking = False
        """A look (a read of the device) is in progress."""
        self._running = anyio.CancelScope()
        """The run in progress: a look that finds the device in its error state cancels it."""
        self._error = 0
        """The error state a look found (0: none)."""
        self._hung: HardwareTimeout | None = None
        """A look found the evidence of no progress at the hang bound: the run's error."""
        self._answered = True
        """The last look had an answer from the device."""
        self._copying = False
        """The run is copying its inputs in (else: its kernel and the copy-out)."""

    @classmethod
    async def open(
        cls,
        usb: UsbTransport,
        *,
        image_size: int,
        output_size: int,
        config: SessionConfig | None = None,
        readiness: Readiness | None = None,
    ) -> AcceleratorRunner:
        """Open a session over ``usb`` (booting the GPU) and allocate the model's buffers; the
        session owns ``usb`` from here (closing it with the session, or at once if the session
        cannot be opened)."""
        config = config or SessionConfig()
        try:
            session = await GpuSession.open(usb, config=config, readiness=readiness)
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(config.request_timeout):
                await usb.aclose()
            raise
        accelerator = cls(session, image_size=image_size, output_size=output_size)
        try:
            accelerator._buffers = (
                await session.alloc(image_size + _CALIB_BYTES),
                await session.alloc(output_size * 4),
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.aclose()
            raise
        return accelerator

    async def run(
        self, image: np.ndarray, calib: np.ndarray, *, timeout: float
    ) -> tuple[np.ndarray, PhaseTimes]:
        """Run the model once. ``timeout``: the hang bound, how long the device may make no
        progress. Outside a deadline scope it bounds the kernel's wait (a
        :class:`~aio_runtime.SignalTimeout` past it). Inside one (a frame's) the scope bounds
        every wait (the kernel's up to the session's ``queued_wait_limit``, so that its copy-out
        waits for it on the device), and the device is looked at every
        ``timeout / LOOKS_PER_HANG`` while the run is in progress, which tells a device that
        made no progress for ``timeout`` from a slow one, without reading a busy host as a hung
        device: once the evidence reaches ``timeout`` (over this run and the runs before it that
        the device still owes) the run ends with a :class:`~aio_runtime.HardwareTimeout` there
        and then — under the layer the looks found silent: ``usb-transfer`` where the device did
        not answer, else ``gpu-queue`` — and :meth:`stalled_for` says how long, for a run its
        frame's bound cut first."""
        if not timeout > 0:
            raise ValueError(f"the hang bound must be a positive number of seconds, got {timeout}")
        img = np.ascontiguousarray(image, dtype=np.uint8).reshape(-1)
        if img.size != self.image_size:
            raise ValueError(f"the model takes {self.image_size} image bytes, got {img.size}")
        cal = np.ascontiguousarray(calib, dtype=np.float32).reshape(-1)
        if cal.size != 3:
            raise ValueError(f"the model takes a 3-value calibration, got {cal.size}")
        if self._owed:  # an earlier run left work owed: nobody looked at it since
            self._evidence.paused(now())
        else:
            self._owed = True
            self._progressed()  # idle until now
        failure: Exception | None = None
        ended = anyio.Event()
        self._error = 0
        self._hung = None
        self._starvation.since_last()  # the looks count from here
        async with anyio.create_task_group() as looks:
            looks.start_soon(self._look_until, ended, timeout)
            try:
                with anyio.CancelScope() as self._running:
                    result = await self._run(img, cal, timeout)
            except Exception as exc:  # raised below, not as an exception group
                failure = exc
            ended.set()  # the looker is done at its next step...
            if self._looking:
                looks.cancel_scope.cancel()  # ...or at once, from a look in progress
        if self._running.cancelled_caught and self._hung is not None:
            failure = self._hung
        elif self._running.cancelled_caught:  # a look found the device in its error state
            failure = GpuFault(
                f"the GPU entered its error state (interrupt 0x{self._error:x}) while running "
                "the model",
                source=self._error,
            )
        if failure is not None:
            raise failure
        self._owed = False
        return result

    async def _run(
        self, img: np.ndarray, cal: np.ndarray, timeout: float
    ) -> tuple[np.ndarray, PhaseTimes]:
        assert self._buffers is not None
        inputs, output_buffer = self._buffers
        start = time.perf_counter()
        self._copying = True
        try:
            await self.session.copy_in(inputs, img, cal)  # after any kernel still reading them
        finally:
            self._copying = False
        self._progressed()
        copied = time.perf_counter()
        submitted = [copied]
        scope = current_deadline()
        self._timeline, raw = await self.session.run_kernel_and_copy_out(
            MODEL_KERNEL,
            [inputs, inputs.address + self.image_size, output_buffer],
            output_buffer,
            reads=[inputs],
            # In a scope the scope bounds it (a kernel that is only slow is not a hung one), up
            # to the longest wait the device can make for it with its copy-out queued behind.
            timeout=timeout
            if scope is None
            else max(timeout, min(scope.remaining(), self.session.queued_wait_limit)),
            on_submitted=lambda: submitted.__setitem__(0, time.perf_counter()),
        )
        self._progressed()
        done = time.perf_counter()
        output = np.frombuffer(bytes(raw), dtype=np.float32).reshape(1, self.output_size)
        return output, PhaseTimes(copied - start, submitted[0] - copied, done - submitted[0])

    def _progressed(self) -> None:
        self._steps += 1
        self._evidence.progressed(now(), (self._steps, self._timeline))

    async def _look_until(self, ended: anyio.Event, hang_after: float) -> None:
        """Until the run has ended, look at the device every ``hang_after / LOOKS_PER_HANG``,
        noting how late each look was; end the run as hung once the evidence reaches
        ``hang_after``."""
        interval = hang_after / LOOKS_PER_HANG
        due = now() + interval
        while True:
            try:
                await wait_complete(
                    ended,
                    awaited="the run's end",
                    error=SignalTimeout,
                    timeout=max(0.0, due - now()),
                )
                return
            except SignalTimeout:  # still running: time to look
                looked = now()
                await self._look(bound=interval, late=max(0.0, looked - due))
            except BudgetExhausted:  # the run's bound ran out: the run is cut there too
                return
            due = looked + interval  # a look the device did not answer took that long already
            stalled = self._evidence.stalled
            if stalled >= hang_after - _RESOLUTION:
                self._hung = self._hang(stalled, hang_after)
                self._running.cancel()
                return

    def _hang(self, stalled: float, hang_after: float) -> HardwareTimeout:
        """The error of a run on a device seen to make no progress for ``stalled`` seconds."""
        copying = self._copying
        return HardwareTimeout(
            awaited=(
                "the model's inputs copied in" if copying else "the model's kernel and copy-out"
            ),
            timeout=hang_after,
            elapsed=stalled,
            layer=Layer.GPU_QUEUE if self._answered else Layer.USB_TRANSFER,
            detail="the accelerator has made no progress: hung"
            + ("" if self._answered else " (it does not answer)"),
        )

    async def _look(self, *, bound: float, late: float) -> None:
        """Read the timeline (within ``bound``: a device that does not answer has made no
        progress) and note what it shows. A device in its error state ends the run: nothing it
        waits for will come."""
        steps, start = self._steps, now()
        value: int | None = None
        self._looking = True
        try:
            with anyio.move_on_after(bound) as scope:
                value, error = await self.session.timeline.read_state()
                if error:  # nothing is submittable until a recovery
                    self.session.timeline.error_state(error)
                    self._error = error
                    self._running.cancel()
        except RuntimeFault:  # a read that fails shows no progress (the run meets the fault)
            pass
        finally:
            self._looking = False
        end = now()
        late += self._starvation.since_last()  # a starved host is no evidence against the device
        if steps != self._steps:
            return  # a step finished meanwhile: that is the news
        self._answered = value is not None
        if value is None:
            overrun = max(0.0, end - start - bound) if scope.cancelled_caught else 0.0
            self._evidence.looked(end, None, late=late + overrun)
        elif value != self._timeline:
            self._timeline = value
            self._evidence.progressed(end, (steps, value))
        else:
            self._evidence.looked(start, (steps, value), late=late)

    async def stalled_for(self) -> float:
        """Seconds the device has been seen to make no progress while it owed a run (0 when
        nothing is owed): how a hung device — a kernel that never completes, a copy fence or a
        USB transfer that never does — is told from a slow one, whose runs overrun the frame's
        budget but keep finishing steps. The evidence comes from the looks taken while runs were
        in progress (see :class:`StallEvidence`): time passing is none, and neither is a host
        that did not look in time. Nothing is read now."""
        return self._evidence.stalled if self._owed else 0.0

    async def aclose(self) -> None:
        await self.session.aclose()

    async def answers(self, *, timeout: float) -> bool:
        """Whether the device still answers: one bridge read within ``timeout`` (False for a
        device that went away). A session that failed is closed with :meth:`aclose` when it
        does, else with :meth:`abandon`."""
        try:
            return await bridge_answers(self.session.usb, timeout=timeout)
        except DeviceLost:
            return False

    async def abandon(self) -> None:
        """Close without a word to the device: one that does not answer
        (:meth:`GpuSession.abandon <transports.gpu.GpuSession.abandon>`)."""
        await self.session.abandon()


class AcceleratorBackend:
    """An accelerator session: one run at a time; a run that makes no progress for
    ``kernel_timeout`` (the hang bound) ends hung (:meth:`AcceleratorRunner.run
    <pipelines.dms.backends.accelerator.AcceleratorRunner.run>`)."""

    runs_back_to_back = False

    def __init__(self, runner: AcceleratorRunner, *, kernel_timeout: float) -> None:
        self.runner = runner
        self.kernel_timeout = kernel_timeout

    async def infer(self, image: np.ndarray, calib: np.ndarray) -> Inference:
        output, phases = await self.runner.run(image, calib, timeout=self.kernel_timeout)
        return Inference(output.reshape(-1), phases.device)

    async def aclose(self) -> None:
        await self.runner.aclose()


@contextlib.asynccontextmanager
async def open_accelerator(
    config: ServiceConfig, contract: ModelContract, opener: TransportOpener
) -> AsyncIterator[Device]:
    session_config = SessionConfig(
        kernel_timeout=config.gpu_hang_after,
        fence_timeout=config.fence_timeout,
        bulk_timeout=config.bulk_timeout,
    )
    probe_timeout = config.budget

    @contextlib.asynccontextmanager
    async def session(readiness: Readiness) -> AsyncIterator[ModelBackend]:
        usb: LentTransport | None = None
        try:
            with deadline_scope(config.device_open_timeout, name="accelerator open"):
                usb = await link.take()
                runner = await AcceleratorRunner.open(
                    usb,
                    image_size=MODEL_INPUT_SIZE,
                    output_size=contract.output_length,
                    config=session_config,
                    readiness=readiness,
                )
            backend = AcceleratorBackend(runner, kernel_timeout=config.gpu_hang_after)
            try:
                yield backend
            except Exception:
                # The session failed: a device that no longer answers is not waited for.
                if await runner.answers(timeout=probe_timeout):
                    await backend.aclose()
                else:
                    await runner.abandon()
                raise
            except BaseException:
                await backend.aclose()
                raise
            await backend.aclose()
        finally:
            if usb is not None:
                link.give_back(usb)

    async with AcceleratorLink(opener, probe_timeout=probe_timeout) as link:
        yield Device("accelerator", contract, session, restartable=True, probe=link.probe)
