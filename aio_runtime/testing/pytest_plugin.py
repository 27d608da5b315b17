"""pytest fixtures for testing code built on the runtime (loaded through the ``pytest11`` entry point)."""

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
