"""The threaded mode: a simulation on its own thread and event loop.

In-process, the simulated bridge and GPU run on the caller's loop (deterministic under virtual
time). :class:`SimServer` runs them instead on a thread of their own — engines writing memory that
the host polls from another thread, as real hardware does — which is what latency benchmarks and
the umockdev device need. Everything that touches the simulation goes through :meth:`SimServer.call`
(fire and forget) or :meth:`SimServer.run` (wait for the result): the calls run in order, in a task
on the simulation's loop, so the simulation itself stays single-threaded and needs no locks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

from aio_runtime import get_logger

__all__ = ["SimServer"]

_log = get_logger(__name__)

D = TypeVar("D")
T = TypeVar("T")


class SimServer(Generic[D]):
    """Runs ``factory()`` — an async context manager yielding the simulated device — on a new
    thread's asyncio loop until :meth:`stop`. Use as a (synchronous) context manager::

        with SimServer(lambda: SimDevice(...)) as server:
            transport = SimUsbTransport(server.device.bridge, call=server.call)
    """

    def __init__(
        self,
        factory: Callable[[], AbstractAsyncContextManager[D]],
        *,
        start_timeout: float = 10.0,
    ) -> None:
        self._factory = factory
        self._start_timeout = start_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls: asyncio.Queue[tuple[Callable[..., object], tuple[Any, ...]]] = asyncio.Queue()
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._device: D | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="sim-server", daemon=True)

    @property
    def device(self) -> D:
        if self._device is None:
            raise RuntimeError("the simulation is not running")
        return self._device

    def start(self) -> SimServer[D]:
        self._thread.start()
        if not self._ready.wait(self._start_timeout):
            raise TimeoutError(f"the simulation did not start within {self._start_timeout} s")
        if self._error is not None:
            raise RuntimeError("the simulation failed to start") from self._error
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start() or stop()
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._calls = asyncio.Queue()  # bound to this loop
        self._stopping = asyncio.Event()
        async with self._factory() as device:
            self._device = device
            dispatcher = asyncio.create_task(self._dispatch())
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                dispatcher.cancel()

    async def _dispatch(self) -> None:
        """Run handed-over calls in order, in a task of the simulation (so they may use anything
        a task can: start tasks, create events)."""
        while True:
            fn, args = await self._calls.get()
            try:
                fn(*args)
            except Exception:
                _log.exception("a call into the simulation failed", call=repr(fn))

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the simulation's thread, soon; do not wait for it."""
        if self._loop is None or self._loop.is_closed():
            raise RuntimeError("the simulation is not running")
        self._loop.call_soon_threadsafe(self._calls.put_nowait, (fn, args))

    def run(self, fn: Callable[..., T], *args: Any, timeout: float = 10.0) -> T:
        """Run ``fn(*args)`` on the simulation's thread and return its result (from another
        thread only: the simulation's own thread would wait for itself)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("SimServer.run() from the simulation's own thread")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def invoke() -> None:
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        self.call(invoke)
        return future.result(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass  # the loop closed meanwhile
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the simulation did not stop within {timeout} s")
        if self._error is not None:
            raise RuntimeError("the simulation failed") from self._error

    def __enter__(self) -> SimServer[D]:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
