"""Stopping a command at any moment: SIGINT and SIGTERM, from the moment ``aio-dms`` starts to the
moment its process is gone.

:class:`Stopping` is installed first thing (:meth:`Stopping.for_process`, by the entry point,
:mod:`pipelines.__main__`). The first signal stops the command:

- while the entry point imports what it needs to report a stop, it is held, and acted on once
  that is imported whole (:meth:`Stopping.arm`): an import interrupted half-way is not safe to
  redo, and the report needs its modules;
- before the command's event loop runs, by raising :class:`Interrupted` where the command is
  (importing, parsing, loading);
- while the loop runs, by calling what the command registered (:meth:`Stopping.calling`), which
  cancels its work so that it ends with its summary;
- once the command's work has ended, it changes nothing: the command is ending anyway, with the
  exit code its work made.

A second signal ends the process at once, exit code 130, without a traceback — unless it is the
first one again: the same signal within :data:`ECHO` seconds of it (GNU ``timeout``, for one,
sends its signal to the command and then to the command's process group). That holds to the
process's last moment: as the interpreter finalises it puts the default handlers back (a signal
then killed the process by the signal, rc -2 or -15, or an echo did), so a process that
:meth:`Stopping.finish` ends leaves before that, by ``os._exit`` with its exit code, once the
threads it waits for have ended and the exit functions registered after :meth:`for_process`
have run.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType

from .exit_codes import ExitCode

TYPE_CHECKING = False  # typing itself is not imported: this module is imported before the
if TYPE_CHECKING:  # handlers are in, and typing would be most of its cost
    from typing import Any, NoReturn

__all__ = ["ECHO", "Interrupted", "Stopping"]

ECHO = 0.1
"""Seconds within which the first signal, received again, is the same request (not a second)."""


class Interrupted(BaseException):
    """A signal stopped the command before its work had begun (a ``BaseException``, as
    ``KeyboardInterrupt`` is: nothing should catch it on the way)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Phase(enum.Enum):
    """What a first signal does."""

    HELD = "held: acted on at arm()"
    RAISES = "raises Interrupted"
    CALLS = "calls what the command registered"
    ENDED = "changes nothing: the command's work has ended"


class Stopping:
    """The command's signal handling: see the module docstring."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.signals = 0
        """Signals received so far (the first one's echo not counted)."""
        self._first: tuple[int, float] | None = None
        """The first signal and when it came (the monotonic clock)."""
        self._phase = _Phase.RAISES
        self._stop: int | None = None
        """The first signal, if it came before the command's work had ended."""
        self._pending = False
        """The stop is still to be made: held, or raised where nothing could take it (an
        exception raised in a finaliser is dropped by the interpreter)."""
        self._on_signal: Callable[[], None] | None = None
        self._at_exit: Callable[[], None] | None = None
        self._exit_code: int | None = None

    @classmethod
    def install(cls) -> Stopping:
        """Handle SIGINT and SIGTERM from now on (the main thread only); a first signal raises
        :class:`Interrupted` until :meth:`calling`."""
        stopping = cls()
        stopping._install()
        return stopping

    @classmethod
    def for_process(cls) -> Stopping:
        """:meth:`install` for the whole of this process's life, a first signal held until
        :meth:`arm`; the process ends through :meth:`finish`."""
        stopping = cls()
        stopping.hold()
        stopping._install()
        atexit.register(stopping._exit_now)  # the first registered: it runs last
        previous = sys.unraisablehook

        def unraisable(report: Any) -> None:
            if not isinstance(report.exc_value, Interrupted):
                previous(report)  # an Interrupted dropped is still to be acted on (_pending)

        sys.unraisablehook = unraisable
        return stopping

    def _install(self) -> None:
        # Both at once: no moment with one signal handled here and the other not.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
        try:
            for signum in self.SIGNALS:
                signal.signal(signum, self._handle)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    @property
    def requested(self) -> bool:
        """A signal asked the command to stop (before its work had ended)."""
        return self._stop is not None

    def hold(self) -> None:
        """From now on a first signal is held (recorded, nothing raised) until :meth:`arm`."""
        self._phase = _Phase.HELD

    def arm(self) -> None:
        """From now on a first signal raises :class:`Interrupted`; one held so far raises it
        here."""
        self._phase = _Phase.RAISES
        if self._pending and self._stop is not None:
            self._pending = False
            raise Interrupted(self._stop)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        at = time.monotonic()
        if self._first is None:
            self._first = (signum, at)
        elif self._first[0] == signum and at - self._first[1] < ECHO:
            return  # the first one, delivered twice
        self.signals += 1
        if self.signals > 1:
            self._exit(ExitCode.INTERRUPTED, self._at_exit)
        if self._phase is _Phase.ENDED:
            return
        self._stop, self._pending = signum, True
        if self._phase is _Phase.CALLS and self._on_signal is not None:
            self._pending = False
            self._on_signal()
        elif self._phase is _Phase.RAISES:
            raise Interrupted(signum)  # _pending stays set until something acts on it

    @contextlib.contextmanager
    def calling(
        self, on_signal: Callable[[], None], at_exit: Callable[[], None] | None = None
    ) -> Iterator[None]:
        """While the block runs, the first signal calls ``on_signal`` (from the signal handler:
        it must only schedule the stop, e.g. ``loop.call_soon_threadsafe(scope.cancel)``), and
        a second one ``at_exit`` (if given) before the process ends (what must not outlive it:
        the processes it started). A signal before the block has already unwound the command
        (:class:`Interrupted`) — or, where the interpreter dropped that exception, is acted on
        as the block begins. Once the block has ended, the command's work has: a first signal
        changes nothing any more."""
        self._on_signal, self._at_exit = on_signal, at_exit
        self._phase = _Phase.CALLS
        try:
            if self._pending:
                self._pending = False
                on_signal()
            yield
        finally:
            self._phase = _Phase.ENDED
            self._on_signal = self._at_exit = None

    def end(self) -> None:
        """The command's work has ended (whatever it was): a first signal changes nothing any
        more."""
        self._phase = _Phase.ENDED

    def finish(self, code: int) -> NoReturn:
        """End the process with ``code``: the threads it waits for end and the exit functions
        run as usual, then the process leaves at once, before the interpreter's finalisation
        puts the default signal handlers back (see the module's description)."""
        self._phase = _Phase.ENDED
        self._exit_code = code
        sys.exit(code)

    def _exit_now(self) -> None:
        if self._exit_code is not None:
            self._exit(self._exit_code)

    @staticmethod
    def _exit(code: int, first: Callable[[], None] | None = None) -> NoReturn:
        if first is not None:
            with contextlib.suppress(Exception):
                first()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
