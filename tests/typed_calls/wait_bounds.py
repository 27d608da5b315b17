"""Calls of the waits as a type checker sees them: the right forms pass, a call with neither
bound (or with both) is refused. Checked by ``tests/test_wait_bounds.py`` with mypy
(``--warn-unused-ignores``: each ``ignore`` below must be needed, so each wrong call must be
refused)."""

from typing import assert_type

import anyio

from aio_runtime import (
    Completion,
    MemoryRegisters,
    ModelTimeout,
    SignalTimeout,
    WaitBound,
    run_in_thread,
    wait_complete,
    wait_register,
    wait_until,
)


async def read_async() -> int:
    return 1


async def right(bound: WaitBound, done: Completion[str], registers: MemoryRegisters) -> None:
    # a bound of its own: error= and timeout= (timeout may be left to a deadline_scope)
    assert_type(
        await wait_until(lambda: 1, bool, awaited="w", error=SignalTimeout, timeout=1.0), int
    )
    assert_type(await wait_until(read_async, bool, awaited="w", error=SignalTimeout), int)
    # or a shared one: within=
    assert_type(await wait_until(lambda: "x", bool, awaited="w", within=bound), str)
    assert_type(await wait_complete(done, awaited="c", error=SignalTimeout, timeout=1.0), str)
    assert_type(await wait_complete(done, awaited="c", within=bound), str)
    assert_type(await run_in_thread(lambda: 2.0, awaited="t", error=ModelTimeout, timeout=1), float)
    assert_type(await run_in_thread(lambda: b"", awaited="t", within=bound), bytes)
    assert_type(await wait_register(registers, 0, value=1, awaited="r", timeout=1.0), int)
    assert_type(await wait_register(registers, 0, value=1, awaited="r", within=bound), int)
    await anyio.lowlevel.checkpoint()


async def wrong(bound: WaitBound, done: Completion[str], registers: MemoryRegisters) -> None:
    await wait_until(lambda: 1, bool, awaited="w", timeout=1.0)  # type: ignore[call-overload]
    await wait_until(read_async, bool, awaited="w")  # type: ignore[call-overload]
    await wait_until(  # type: ignore[call-overload]
        lambda: 1, bool, awaited="w", within=bound, timeout=1.0
    )
    await wait_until(  # type: ignore[call-overload]
        lambda: 1, bool, awaited="w", within=bound, error=SignalTimeout
    )
    await wait_complete(done, awaited="c", timeout=1.0)  # type: ignore[call-overload]
    await run_in_thread(lambda: 1, awaited="t", timeout=1.0)  # type: ignore[call-overload]
    await wait_register(  # type: ignore[call-overload]
        registers, 0, value=1, awaited="r", within=bound, timeout=1.0
    )
