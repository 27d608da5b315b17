"""Recording availability transitions and log events in tests."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, MutableMapping
from typing import Any

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream

from .._core._health import Availability, AvailabilityMachine, AvailabilityState, Transition

__all__ = ["TransitionRecorder", "capture_logs"]


class TransitionRecorder:
    """Subscribes to an :class:`AvailabilityMachine` and keeps every transition, in order::

        with TransitionRecorder(machine) as recorder:
            ...
            assert recorder.availabilities() == [UNAVAILABLE, AVAILABLE, UNAVAILABLE]

    The first recorded transition is the state at subscription (``previous`` is None).
    """

    def __init__(self, machine: AvailabilityMachine) -> None:
        self.machine = machine
        self._stack = contextlib.ExitStack()
        self._stream: MemoryObjectReceiveStream[Transition] | None = None
        self._seen: list[Transition] = []

    def __enter__(self) -> TransitionRecorder:
        self._stream = self._stack.enter_context(self.machine.subscribe())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._drain()
        self._stack.close()
        self._stream = None

    def _drain(self) -> None:
        if self._stream is None:
            return
        while True:
            try:
                self._seen.append(self._stream.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return

    @property
    def transitions(self) -> list[Transition]:
        self._drain()
        return list(self._seen)

    def states(self) -> list[AvailabilityState]:
        return [t.current for t in self.transitions]

    def availabilities(self) -> list[Availability]:
        return [s.availability for s in self.states()]

    async def wait_for(self, availability: Availability, *, timeout: float) -> AvailabilityState:
        """The first recorded state (past or future) with ``availability``; fails after ``timeout``."""
        if self._stream is None:
            raise RuntimeError("use the recorder as a context manager first")
        with anyio.fail_after(timeout):
            while True:
                for state in self.states():
                    if state.availability is availability:
                        return state
                self._seen.append(await self._stream.receive())


@contextlib.contextmanager
def capture_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Capture structlog events as dicts, with contextvars (frame id, stage, device) merged in."""
    capture = structlog.testing.LogCapture()
    previous = structlog.get_config()
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),  # every level
        cache_logger_on_first_use=False,
    )
    try:
        yield capture.entries
    finally:
        structlog.configure(**previous)
