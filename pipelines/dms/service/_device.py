"""The model's device as the frames see it, and the task that keeps it open.

:class:`ModelDevice` owns the device's sessions: it opens the device (:func:`open_device`), opens
a session on it and — for a device whose sessions can fail, the accelerator — supervises it: a
session that fails is torn down and opened again with backoff, for as long as the service runs;
the device's probe, every ``backoff_initial`` seconds, ends a backoff (or abandons an opening
attempt begun while the device was away) as soon as the device answers again.
Frames take the session that is current (:attr:`ModelDevice.current`; None while there is none,
and :meth:`ModelDevice.why_unavailable` says why) and report a device fault to that session
(:meth:`DeviceSession.fail`). The first fault reported is the one the session failed with: the
supervisor sees that typed error itself (its layer, what was awaited, what was expected and
observed), and a fault seen once a restart has begun does not restart the next session.
:attr:`ModelDevice.restarts` counts the sessions that failed so (the service's metrics read it,
with :attr:`ModelDevice.contract`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import anyio.abc

from aio_runtime import AvailabilityMachine, Backoff, Readiness, Supervisor

from ..backends.base import Device, ModelBackend, open_device, simulator_plan
from ..backends.link import TransportOpener
from ..config.settings import ServiceConfig
from ..model.contract import ModelContract
from ..model.decode import Decoder

__all__ = ["DeviceSession", "ModelDevice"]


class DeviceSession:
    """One open session of the model's device: its backend, and the error it failed with, once
    it has."""

    def __init__(self, backend: ModelBackend, *, restartable: bool) -> None:
        self.backend = backend
        self.restartable = restartable
        self.error: Exception | None = None
        self._failed = anyio.Event()

    @property
    def failing(self) -> bool:
        """The session has failed and is being replaced: its faults are consequences now."""
        return self.error is not None

    def fail(self, error: Exception) -> None:
        """A frame found the device at fault. The first error is the session's (its supervisor
        sees it); later ones are its consequences. A session that cannot be restarted does not
        fail: each frame's fault is its own."""
        if self.restartable and self.error is None:
            self.error = error
            self._failed.set()

    async def failed(self) -> Exception:
        """Wait until the session fails; the error it failed with."""
        await self._failed.wait()
        assert self.error is not None
        return self.error


class ModelDevice:
    """The model's device: the session that runs frames now, the decoder of its outputs, and the
    task that keeps a session open (:meth:`serve`)."""

    def __init__(
        self,
        config: ServiceConfig,
        availability: AvailabilityMachine,
        *,
        transport: TransportOpener | None = None,
    ) -> None:
        self.config = config
        self.availability = availability
        self.plan = simulator_plan(config, transport)
        """The simulated accelerator's fault plan, when the model runs on one in this process."""
        self._transport = transport
        self.current: DeviceSession | None = None
        """The session frames run on; None while there is none."""
        self.readiness = Readiness()
        """The readiness layers of the current session (or of the one being opened)."""
        self.decoder = Decoder({})
        """Decodes the model's outputs, once the model's contract is read."""
        self.contract: ModelContract | None = None
        """The model's contract, once read."""
        self.restarts = 0
        """Sessions that failed while running and were torn down to be opened again."""
        self.ready = anyio.Event()
        """Set once a model can first run frames, or opening it failed."""
        self._why_none = "loading the model"
        self._name = "model"

    def why_unavailable(self, session: DeviceSession | None) -> str:
        """Why ``session`` (the current one, as a frame took it) runs no frames."""
        if session is None:
            return self._why_none
        return f"the {self._name} is restarting ({self.availability.state.reason})"

    async def serve(
        self,
        model_cpus: frozenset[int] | None = None,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Open the device (``model_cpus``: a CPU runner's thread's CPUs) and keep a session open
        until cancelled. Started (``task_status``) once the model is loaded and its contract read:
        what fails before that is raised to whoever started it."""
        opened = open_device(
            self.config, plan=self.plan, transport=self._transport, model_cpus=model_cpus
        )
        async with opened as device:
            self.decoder = Decoder(device.contract.output_slices)
            self.contract = device.contract
            self._name = device.name
            self._why_none = f"opening the {device.name}"
            task_status.started()
            if not device.restartable:  # it never fails: open until the service stops
                async with self._session(device) as session:
                    await session.failed()
                return
            cfg = self.config
            await Supervisor(
                device.name,
                lambda: self._session(device),
                self._until_failed,
                availability=self.availability,
                backoff=Backoff(initial=cfg.backoff_initial, cap=cfg.backoff_max),
                healthy_after=cfg.healthy_after,
                probe=device.probe,  # every backoff_initial: reopened as soon as it is back
            ).run()

    @contextlib.asynccontextmanager
    async def _session(self, device: Device) -> AsyncIterator[DeviceSession]:
        readiness = self.readiness = Readiness()
        try:
            async with device.open_session(readiness) as backend:
                session = DeviceSession(backend, restartable=device.restartable)
                self.current = session
                self.ready.set()
                try:
                    yield session
                finally:
                    self.current = None
                    self._why_none = self.why_unavailable(session)
        finally:
            self.ready.set()  # opened or not: frames flow, and say why there is no output

    async def _until_failed(self, session: DeviceSession) -> None:
        error = await session.failed()
        self.restarts += 1  # the supervisor tears it down and opens the next
        raise error.with_traceback(None)  # raised anew here: the frame that saw it has moved on
