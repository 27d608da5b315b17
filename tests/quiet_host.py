"""A host that never configured logging, for tests of a quiet library."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import structlog


@contextlib.contextmanager
def unconfigured_logging() -> Iterator[None]:
    """Inside the block, logging as an application that never configured it has it: no handler
    on the root logger (pytest's own, added for each phase of a test, are taken off for the
    block and put back), and structlog on its defaults, which print to standard output."""
    root = logging.getLogger()
    handlers, previous = root.handlers[:], structlog.get_config()
    root.handlers.clear()
    structlog.reset_defaults()
    try:
        yield
    finally:
        root.handlers[:] = handlers
        structlog.configure(**previous)
