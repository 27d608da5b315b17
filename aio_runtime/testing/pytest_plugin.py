"""pytest fixtures for testing code built on the runtime (loaded through the ``pytest11`` entry point),
and a warning (:class:`AnyioTestRunOnAsyncio`) for each ``anyio`` test that pytest-asyncio has
claimed, as its ``asyncio_mode = auto`` does: such a test runs on asyncio whatever its backend."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest

from .._core._ownership import Ledger, swap_process_ledger
from ._recorder import capture_logs


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    """A fresh ledger for the test; the test fails if any resource is still live at teardown."""
    fresh = Ledger()
    previous = swap_process_ledger(fresh)
    try:
        yield fresh
    finally:
        swap_process_ledger(previous)
    fresh.assert_empty()


@pytest.fixture
def captured_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """structlog events logged during the test, as dicts (context variables merged in)."""
    with capture_logs() as entries:
        yield entries


class AnyioTestRunOnAsyncio(pytest.PytestWarning):
    """An anyio test that pytest-asyncio has claimed: it runs on asyncio, whatever its
    ``anyio_backend`` says (pytest-asyncio's ``asyncio_mode = auto`` claims every async test)."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        anyio_test = item.get_closest_marker("anyio") is not None or "anyio_backend" in getattr(
            item, "fixturenames", ()
        )
        if anyio_test and item.get_closest_marker("asyncio") is not None:
            item.warn(
                AnyioTestRunOnAsyncio(
                    "pytest-asyncio runs this anyio test, on asyncio whatever its anyio_backend "
                    "says (asyncio_mode = auto claims every async test): set asyncio_mode = "
                    "strict and mark the asyncio tests @pytest.mark.asyncio, or mark them all "
                    "@pytest.mark.anyio"
                )
            )
