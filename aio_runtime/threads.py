"""Blocking calls (pyusb, onnxruntime) on worker threads, under the same bound as every wait.

A blocking call cannot be cancelled from the event loop. :func:`run_in_thread` therefore runs it on
its own worker thread and waits for it like any hardware completion: bounded, with a typed error.
When the bound is reached, ``cancel()`` asks the call to stop (onnxruntime's run termination; a
pyusb call ends by its own libusb timeout, which callers must set no longer than the time left),
and the wait continues — shielded, for at most ``drain_timeout`` — until the call has returned, so
the buffers it uses are not reused under it. A call that still has not returned is reported with
``in_flight = True``: its buffers stay reserved.

Each call gets its own daemon thread, so a call that never returns cannot starve the others.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from .completion import Completion
from .errors import HardwareTimeout, Layer
from .waits import WaitBound, wait_complete

__all__ = ["run_in_thread"]

T = TypeVar("T")


async def run_in_thread(
    fn: Callable[[], T],
    *,
    awaited: str,
    error: type[HardwareTimeout] | None = None,
    timeout: float | None = None,
    layer: Layer | None = None,
    within: WaitBound | None = None,
    cancel: Callable[[], object] | None = None,
    drain_timeout: float = 1.0,
) -> T:
    """Run ``fn()`` on a worker thread and return its result (or raise its exception)."""
    done: Completion[T] = Completion()
    setter = done.threadsafe_setter()

    def work() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the waiting task, not lost on the thread
            setter.set_exception(exc)
        else:
            setter.set_result(result)

    threading.Thread(target=work, name=f"worker: {awaited}", daemon=True).start()
    return await wait_complete(
        done,
        awaited=awaited,
        error=error,
        timeout=timeout,
        layer=layer,
        within=within,
        cancel=cancel,
        drain_timeout=drain_timeout,
    )
