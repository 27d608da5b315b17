"""Project-wide test setup: the core's tests run on asyncio and on trio (through anyio).

trio runs on a ``MockClock`` at rate 1 (real time) so that ``virtual_time()`` can switch it to
virtual time inside a test, as it switches asyncio's loop.

Every test gets back the SIGINT and SIGTERM handlers it started with: ``aio-dms``'s entry point
installs its own (:class:`pipelines.stopping.Stopping`), and a test that runs it in process must
not leave them to the tests after it (nor take pytest's Ctrl-C from the session). Likewise the
logging that ``configure_logging`` sets up (a handler on the root logger, the root's level) ends
with the test that set it up.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator

import pytest
import trio.testing

from aio_runtime._core import _log


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
