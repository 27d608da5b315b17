"""AsyncResource: ``async with`` closes a resource through its one aclose()."""

from __future__ import annotations

import anyio
import pytest

from aio_runtime import AsyncResource

pytestmark = pytest.mark.anyio


class Port(AsyncResource):
    def __init__(self) -> None:
        self.closes = 0

    async def aclose(self) -> None:
        self.closes += 1
        await anyio.lowlevel.checkpoint()


async def test_entering_returns_the_resource_and_leaving_closes_it_once():
    port = Port()
    async with port as entered:
        assert entered is port
        assert port.closes == 0
    assert port.closes == 1


async def test_leaving_by_an_exception_closes_it_and_lets_the_exception_through():
    port = Port()
    with pytest.raises(OSError, match="link down"):
        async with port:
            raise OSError("link down")
    assert port.closes == 1


async def test_leaving_by_cancellation_closes_it():
    port = Port()
    with anyio.CancelScope() as scope:
        async with port:
            scope.cancel()
            await anyio.sleep(1)
    assert port.closes == 1


def test_a_resource_must_say_how_it_is_closed():
    class Unclosable(AsyncResource):
        pass

    with pytest.raises(TypeError, match="aclose"):
        Unclosable()
