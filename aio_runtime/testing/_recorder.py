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
from .._core._log import event_of

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


class _Capture(logging.Handler):
    def __init__(self, entries: list[MutableMapping[str, Any]]) -> None:
        super().__init__()
        self.entries = entries

    def emit(self, record: logging.LogRecord) -> None:
        event = event_of(record)
        if event is not None:
            self.entries.append(event)


@contextlib.contextmanager
def capture_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Capture log events as dicts, in order, with contextvars (frame id, stage, device) merged
    in and their ``log_level``: the events of :func:`aio_runtime.get_logger`'s loggers (through
    a handler on the root logger, whose level is lowered to let every level through for the
    block; a logger given a level of its own still filters) and of bare structlog loggers."""
    entries: list[MutableMapping[str, Any]] = []
    structlog_capture = structlog.testing.LogCapture()
    structlog_capture.entries = entries
    previous = structlog.get_config()
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog_capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),  # every level
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    level, handler = root.level, _Capture(entries)
    root.addHandler(handler)
    root.setLevel(logging.NOTSET)
    try:
        yield entries
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        structlog.configure(**previous)
