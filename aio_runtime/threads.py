"""Blocking calls (pyusb, onnxruntime) on worker threads, under the same bound as every wait.

A blocking call cannot be cancelled from the event loop. :func:`run_in_thread` therefore runs it on
its own worker thread and waits for it like any hardware completion: bounded, with a typed error.
When the bound is reached (or the waiting task is cancelled), ``cancel()`` — if given — asks the
call to stop (onnxruntime's run termination; a pyusb call ends by its own libusb timeout, which
callers set no longer than the time left), and the wait continues, shielded, for at most
``drain_timeout`` until the call has returned, so the buffers it uses are not reused under it. A
call that still has not returned is reported (``in_flight = True`` on a timeout, a note on the
error) and stays in the ledger as a live worker until it does: its buffers stay reserved.

By default each call gets its own daemon thread, so a call that never returns cannot starve the
others. Hot paths (a stage that runs a call every frame) pass a :class:`WorkerThread` instead: one
long-lived thread that runs its calls in order, so starting a thread — which waits for the new
thread to take the GIL, up to the interpreter's switch interval on a busy process — never stalls
the event loop. A call that never returns then holds up the later calls on that worker (each still
bounded). The call runs in a copy of the caller's context (log context, ledger).
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import TypeVar

from .clock import validate_timeout
from .completion import Completion
from .errors import HardwareTimeout, Layer
from .ownership import current_ledger
from .waits import WaitBound, _resolve, wait_complete

__all__ = ["WorkerThread", "run_in_thread"]

T = TypeVar("T")


class WorkerThread:
    """A long-lived daemon thread that runs the calls handed to it, one at a time, in order.

    Started on its first call; :meth:`close` lets it end once its queue is empty."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, work: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        self._calls.put(work)

    def _serve(self) -> None:
        for work in iter(self._calls.get, None):  # blocks on the queue (it does not poll)
            work()

    def close(self) -> None:
        if self._thread is not None:
            self._calls.put(None)


def _no_stop_request() -> None:
    """For calls that cannot be asked to stop: they end by their own timeout."""


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
    worker: WorkerThread | None = None,
) -> T:
    """Run ``fn()`` on a worker thread and return its result (or raise its exception).

    The bound is checked before the thread starts: a call the runtime refuses never runs.
    """
    bound = _resolve(within, timeout, awaited, error, layer)
    validate_timeout(drain_timeout, what="drain_timeout")
    done: Completion[T] = Completion()
    setter = done.threadsafe_setter()
    context = contextvars.copy_context()
    ledger = current_ledger()
    entry = ledger.open("worker thread", awaited)

    def work() -> None:
        # The call has let go of its buffers once it returns: the ledger says so before the
        # waiting task can see the outcome.
        try:
            result = context.run(fn)
        except BaseException as exc:  # handed to the waiting task, not lost on the thread
            ledger.close(entry)
            setter.set_exception(exc)
        else:
            ledger.close(entry)
            setter.set_result(result)

    if worker is not None:
        worker.submit(work)
    else:
        threading.Thread(target=work, name=f"worker: {awaited}", daemon=True).start()
    return await wait_complete(
        done,
        awaited=awaited,
        within=bound,
        cancel=cancel or _no_stop_request,
        drain_timeout=drain_timeout,
    )
