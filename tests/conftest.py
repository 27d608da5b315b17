"""Project-wide test setup: the core's tests run on asyncio and on trio (through anyio).

trio runs on a ``MockClock`` at rate 1 (real time) so that ``virtual_time()`` can switch it to
virtual time inside a test, as it switches asyncio's loop.

Every test gets back the SIGINT and SIGTERM handlers it started with: ``aio-dms``'s entry point
installs its own (:class:`pipelines.stopping.Stopping`), and a test that runs it in process must
not leave them to the tests after it (nor take pytest's Ctrl-C from the session). Likewise the
logging that ``configure_logging`` sets up (a handler on the root logger, the root's level) ends
with the test that set it up.

A test that outlives its timeout fails alone and the run goes on (pytest-timeout's signal method).
On trio that takes more than a signal: anyio drives a trio test as a guest run from the main
thread, and an exception raised there by SIGALRM leaves the run — and the test in it — going, so the
runner's teardown waits for it forever. A coroutine test on trio is therefore timed from inside its
run: at its timeout the test is cancelled through the run's token and fails with pytest-timeout's
message; one that is still running ``TRIO_GRACE`` seconds later (a loop that never reaches a
checkpoint, a thread that never returns) ends the process with every thread's stack, as the thread
method does.
"""

from __future__ import annotations

import functools
import inspect
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import pytest_timeout
import trio.lowlevel
import trio.testing

from aio_runtime._core import _log

TRIO_GRACE = 10.0
"""Seconds a timed-out trio test has to end once cancelled, before the process is ended."""


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    if request.param == "trio":
        return ("trio", {"clock": trio.testing.MockClock(rate=1.0)})  # a fresh clock per test
    return request.param


@pytest.fixture(autouse=True)
def signal_handlers_restored() -> Iterator[None]:
    """The SIGINT and SIGTERM handlers as they were before the test, whatever it installed."""
    signums = (signal.SIGINT, signal.SIGTERM)
    before = {signum: signal.getsignal(signum) for signum in signums}
    yield
    for signum, handler in before.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def logging_configuration_restored() -> Iterator[None]:
    """Stdlib logging as ``configure_logging`` found it before the test: its handler gone, the
    root logger's level back (pytest's own handlers are left alone)."""
    root = logging.getLogger()
    handler, level = _log._handler, root.level
    yield
    if _log._handler is not handler:
        root.removeHandler(_log._handler)
        if handler is not None:
            root.addHandler(handler)
        _log._handler = handler
    root.setLevel(level)


def _on_trio(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    backend = callspec.params.get("anyio_backend") if callspec is not None else None
    name = backend[0] if isinstance(backend, tuple) else backend
    return name == "trio" and inspect.iscoroutinefunction(getattr(item, "obj", None))


class _TrioTimeout:
    """A trio test's timeout: cancels the test inside its run, then ends the process if that
    did not end it."""

    def __init__(self, item: pytest.Item, settings: Any) -> None:
        self.item, self.settings = item, settings
        self.fired = False
        self._cancel: Callable[[], object] | None = None
        self._lock = threading.Lock()
        self._over = threading.Event()
        self._thread = threading.Thread(
            target=self._watch, name=f"timeout {item.nodeid}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The test's protocol is over (pytest-timeout's cancel)."""
        self._over.set()
        self._thread.join()

    def arm(self, token: trio.lowlevel.TrioToken, scope: trio.CancelScope) -> None:
        with self._lock:
            self._cancel = functools.partial(token.run_sync_soon, scope.cancel)
            if self.fired:
                self._cancel()

    def disarm(self) -> None:
        with self._lock:
            self._cancel = None

    def _watch(self) -> None:
        if self._over.wait(self.settings.timeout):
            return
        with self._lock:
            self.fired = True
            terminal = self.item.config.get_terminal_writer()
            terminal.sep("+", title="Timeout")
            pytest_timeout.dump_stacks(terminal)
            terminal.sep("+", title="Timeout")
            if self._cancel is not None:
                self._cancel()
        if not self._over.wait(TRIO_GRACE):
            pytest_timeout.timeout_timer(self.item, self.settings)  # ends the process

    def bounded(
        self, test: Callable[..., Coroutine[Any, Any, object]]
    ) -> Callable[..., Coroutine[Any, Any, None]]:
        @functools.wraps(test)
        async def run(**kwargs: Any) -> None:
            try:
                with trio.CancelScope() as scope:
                    self.arm(trio.lowlevel.current_trio_token(), scope)
                    await test(**kwargs)
            except BaseException as exc:
                if self.fired:
                    exc.add_note(pytest_timeout.PYTEST_FAILURE_MESSAGE % self.settings.timeout)
                raise
            finally:
                self.disarm()
            if scope.cancelled_caught and self.fired:
                pytest.fail(pytest_timeout.PYTEST_FAILURE_MESSAGE % self.settings.timeout)

        return run


_TRIO_TIMEOUT = pytest.StashKey[_TrioTimeout]()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "signal" or not _on_trio(item):
        return None  # pytest-timeout's own
    timeout = item.stash[_TRIO_TIMEOUT] = _TrioTimeout(item, settings)
    item.cancel_timeout = timeout.stop  # type: ignore[attr-defined]  # what pytest-timeout calls
    timeout.start()
    return True


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[None]:
    timeout = pyfuncitem.stash.get(_TRIO_TIMEOUT, None)
    if timeout is None:
        return (yield)
    test = pyfuncitem.obj
    pyfuncitem.obj = timeout.bounded(test)
    try:
        return (yield)
    finally:
        pyfuncitem.obj = test
