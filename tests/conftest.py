"""Project-wide test setup: the core's tests run on asyncio and on trio (through anyio).

trio runs on a ``MockClock`` at rate 1 (real time) so that ``virtual_time()`` can switch it to
virtual time inside a test, as it switches asyncio's loop.
"""

from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> object:
    if request.param == "trio":
        return ("trio", {"clock": trio.testing.MockClock(rate=1.0)})  # a fresh clock per test
    return request.param
