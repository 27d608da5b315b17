"""Project-wide test setup: the core's tests run on asyncio and on trio (through anyio).

trio runs on a ``MockClock`` at rate 1 (real time) so that ``virtual_time()`` can switch it to
virtual time inside a test, as it switches asyncio's loop.

Every test gets back the SIGINT and SIGTERM handlers it started with: ``aio-dms``'s entry point
installs its own (:class:`pipelines.stopping.Stopping`), and a test that runs it in process must
not leave them to the tests after it (nor take pytest's Ctrl-C from the session).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
import trio.testing


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
