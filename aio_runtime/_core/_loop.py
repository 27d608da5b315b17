"""The running event loop's thread-safe entry point, for code on other threads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio.lowlevel

Wake = Callable[[Callable[[], object]], object]


def loop_hooks() -> tuple[Wake, Callable[[], float]]:
    """The running loop's thread-safe "call this soon on the loop" function, and its clock.

    Call from a task. The clock is read inside those callbacks, where no task is current, so it
    must be the loop's own function rather than anyio's task-based lookup.
    """
    native = anyio.lowlevel.current_token().native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        return native.call_soon_threadsafe, native.time
    run_sync_soon: Wake | None = getattr(native, "run_sync_soon", None)
    if run_sync_soon is None:
        raise RuntimeError(f"no thread-safe wake-up for event loop token {native!r}")
    import trio

    return run_sync_soon, trio.current_time


def loop_clock() -> Callable[[], float]:
    """The running loop's clock, readable anywhere on the loop's thread — in tasks and in plain
    loop callbacks, where anyio's task-based lookup fails. Follows :func:`virtual_time` (the
    loop's clock is looked up at every call). Call from a task."""
    native = anyio.lowlevel.current_token().native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        loop = native
        return lambda: loop.time()
    import trio

    return trio.current_time
