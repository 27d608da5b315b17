"""Stopping a command at any moment: SIGINT and SIGTERM, from the moment ``aio-dms`` starts.

:class:`Stopping` is installed first thing. The first signal stops the command: before its event
loop runs, by raising :class:`Interrupted` where the command is (importing, parsing, loading);
while the loop runs, by calling what the command registered (:meth:`Stopping.calling`), which
cancels its work so that it ends with its summary. A second signal ends the process at once,
exit code 130, without a traceback — unless it is the first one again: the same signal within
:data:`ECHO` seconds of it (GNU ``timeout``, for one, sends its signal to the command and then to
the command's process group).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType

from .exit_codes import ExitCode

__all__ = ["ECHO", "Interrupted", "Stopping"]

ECHO = 0.1
"""Seconds within which the first signal, received again, is the same request (not a second)."""


class Interrupted(BaseException):
    """A signal stopped the command before its work had begun (a ``BaseException``, as
    ``KeyboardInterrupt`` is: nothing should catch it on the way)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Stopping:
    """The command's signal handling: see the module docstring."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signals = 0
        """Signals received so far (the first one's echo not counted)."""
        self._first: tuple[int, float] | None = None
        """The first signal and when it came (the monotonic clock)."""
        self._on_signal: Callable[[], None] | None = None
        self._at_exit: Callable[[], None] | None = None

    @classmethod
    def install(cls) -> Stopping:
        """Handle SIGINT and SIGTERM from now on (the main thread only)."""
        stopping = cls()
        for signum in cls.SIGNALS:
            signal.signal(signum, stopping._handle)
        return stopping

    @property
    def requested(self) -> bool:
        return self.signals > 0

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        at = time.monotonic()
        if self._first is None:
            self._first = (signum, at)
        elif self._first[0] == signum and at - self._first[1] < ECHO:
            return  # the first one, delivered twice
        self.signals += 1
        if self.signals > 1:
            if self._at_exit is not None:
                with contextlib.suppress(Exception):
                    self._at_exit()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(ExitCode.INTERRUPTED)
        if self._on_signal is not None:
            self._on_signal()
        else:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def calling(
        self, on_signal: Callable[[], None], at_exit: Callable[[], None] | None = None
    ) -> Iterator[None]:
        """While the block runs, the first signal calls ``on_signal`` (from the signal handler:
        it must only schedule the stop, e.g. ``loop.call_soon_threadsafe(scope.cancel)``), and
        a second one ``at_exit`` (if given) before the process ends (what must not outlive it:
        the processes it started). A signal before the block has already unwound the command
        (:class:`Interrupted`)."""
        self._on_signal, self._at_exit = on_signal, at_exit
        try:
            yield
        finally:
            self._on_signal = self._at_exit = None
