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
bounded; one whose bound is reached while it is still queued is withdrawn at once, never run).
The call runs in a copy of the caller's context (log context, ledger).

The interpreter's exit waits up to :data:`EXIT_GRACE` for the calls still running on these threads
(one abandoned by its bound, say) and starts no queued one: a native call (an onnxruntime run)
that returned into a finalised interpreter would abort the process.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import queue
import threading
import weakref
from collections.abc import Callable, Collection, Iterator
from typing import TypeVar, Unpack, overload

from ._bounds import BoundArgs, OwnBound, SharedBound, resolve_bound
from ._clock import validate_timeout
from ._completion import Completion
from ._ownership import LedgerKind, current_ledger
from ._waits import drain, wait_complete

__all__ = [
    "EXIT_GRACE",
    "PendingCall",
    "WorkerThread",
    "can_run_realtime",
    "realtime_threads",
    "run_in_thread",
    "worker_thread_ids",
]

T = TypeVar("T")

EXIT_GRACE = 2.0
"""Seconds the interpreter's exit waits for calls still running on worker threads."""


class _Running:
    """The calls running on worker threads, for the interpreter's exit to wait for."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._count = 0
        self._exiting = False
        self._registered = False

    @contextlib.contextmanager
    def call(self) -> Iterator[bool]:
        """Around a call on a worker thread: yields False once the interpreter is exiting (the
        call is then not made)."""
        with self._changed:
            allowed = not self._exiting
            if allowed:
                self._count += 1
            if allowed and not self._registered:
                atexit.register(self.wait_at_exit)
                self._registered = True
        if not allowed:
            yield False
            return
        try:
            yield True
        finally:
            with self._changed:
                self._count -= 1
                self._changed.notify_all()

    def wait_at_exit(self, timeout: float = EXIT_GRACE) -> bool:
        """No call starts from now on; wait for the running ones (at most ``timeout``)."""
        with self._changed:
            self._exiting = True
            return self._changed.wait_for(lambda: self._count == 0, timeout)


_RUNNING = _Running()


class PendingCall:
    """A call handed to a :class:`WorkerThread`. :meth:`withdraw` takes it back while it is still
    queued (behind the calls before it): then it never runs."""

    __slots__ = ("_lock", "_started", "_work")

    def __init__(self, work: Callable[[], None]) -> None:
        self._work: Callable[[], None] | None = work
        self._lock = threading.Lock()
        self._started = False

    def withdraw(self) -> bool:
        """True if the call had not started and now never will (also when it was withdrawn
        before); False once it has started."""
        with self._lock:
            if not self._started:
                self._work = None  # what it would have used is released now, not when reached
            return not self._started

    def run(self) -> None:
        """Run the call unless it was withdrawn. The worker thread calls it when the call's turn
        comes; from then on :meth:`withdraw` returns False."""
        with self._lock:
            work, self._started = self._work, self._work is not None
        if work is not None:
            with _RUNNING.call() as allowed:
                if allowed:
                    work()


class WorkerThread:
    """A long-lived daemon thread that runs the calls handed to it, one at a time, in order.

    Started on its first call; :meth:`close` lets it end once its queue is empty. A call may be
    handed over while another runs: it waits in the queue, and the thread goes from one call to
    the next without a round trip through the event loop. ``cpus``: the CPUs the thread may run
    on (Linux), e.g. to keep a long computation off the event loop's CPU.

    On Linux the thread runs as a batch thread (``SCHED_BATCH``, this thread's only): woken by a
    call from the loop, it does not preempt the thread it is placed beside. The scheduler often
    places a woken thread on its waker's CPU, and a normal thread that had slept runs there at
    once, holding the event loop's thread off its CPU for as long as the call computes (a
    neighbour on the loop then waits milliseconds). Its share of the CPU is unchanged. One made
    inside :func:`realtime_threads` runs at its real-time priority instead (``SCHED_FIFO``)."""

    def __init__(self, name: str, *, cpus: Collection[int] | None = None) -> None:
        self.name = name
        self.cpus = None if cpus is None else frozenset(cpus)
        self.priority = _realtime.get()
        """The real-time priority it runs at (``SCHED_FIFO``); None: a batch thread."""
        self._calls: queue.SimpleQueue[PendingCall | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    @property
    def native_id(self) -> int | None:
        """The thread's id on the platform (Linux's tid), once it has started; None before."""
        return None if self._thread is None else self._thread.native_id

    def submit(self, work: Callable[[], None]) -> PendingCall:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()
        call = PendingCall(work)
        self._calls.put(call)
        return call

    def _serve(self) -> None:
        if self.priority is None:
            _as_batch_thread()
        else:  # checked before the thread was asked for: one that cannot be is a batch thread
            try:
                _set_realtime(self.priority)
            except OSError:
                _as_batch_thread()
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)  # this thread's
        _serving.add(self)
        try:
            for call in iter(self._calls.get, None):  # blocks on the queue (it does not poll)
                call.run()
        finally:
            _serving.discard(self)

    def close(self) -> None:
        if self._thread is not None:
            self._calls.put(None)


_serving: weakref.WeakSet[WorkerThread] = weakref.WeakSet()
"""The worker threads serving calls now."""


def worker_thread_ids() -> list[int]:
    """The native ids of the worker threads serving calls now (the runtime's own threads)."""
    return [tid for worker in list(_serving) if (tid := worker.native_id) is not None]


_realtime: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "aio_runtime_realtime", default=None
)


def _set_realtime(priority: int) -> None:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))  # this thread's


@contextlib.contextmanager
def realtime_threads(priority: int | None) -> Iterator[None]:
    """Inside the block the calling thread (an event loop's) runs at real-time ``priority``
    (``SCHED_FIFO``, Linux), and so does every :class:`WorkerThread` made inside it, in this
    context and the tasks started from it; after it, the calling thread's own policy is given
    back. None: nothing changes. :class:`PermissionError` where this process may not (root,
    ``CAP_SYS_NICE`` or an ``RLIMIT_RTPRIO`` of at least ``priority`` is needed)."""
    if priority is None:
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    _set_realtime(priority)
    token = _realtime.set(priority)
    try:
        yield
    finally:
        _realtime.reset(token)
        os.sched_setscheduler(0, policy, param)


def can_run_realtime(priority: int) -> OSError | None:
    """Whether a thread of this process may run at real-time ``priority``: tried on a thread of
    its own that then ends (None: it may; else why not)."""
    failure: list[OSError] = []

    def probe() -> None:
        try:
            _set_realtime(priority)
        except OSError as exc:
            failure.append(exc)

    thread = threading.Thread(target=probe, name="real-time probe", daemon=True)
    thread.start()
    thread.join()
    return failure[0] if failure else None


def _as_batch_thread() -> None:
    """The calling thread as a batch thread, where the platform has them (Linux)."""
    batch = getattr(os, "SCHED_BATCH", None)
    if batch is not None:
        with contextlib.suppress(OSError):  # a sandbox may refuse it: then it stays as it was
            os.sched_setscheduler(0, batch, os.sched_param(0))


def _no_stop_request() -> None:
    """For calls that cannot be asked to stop: they end by their own timeout."""


@overload
async def run_in_thread(
    fn: Callable[[], T],
    *,
    cancel: Callable[[], object] | None = None,
    drain_timeout: float = 1.0,
    worker: WorkerThread | None = None,
    submitted: Callable[[PendingCall], object] | None = None,
    **bounding: Unpack[OwnBound],
) -> T: ...


@overload
async def run_in_thread(
    fn: Callable[[], T],
    *,
    cancel: Callable[[], object] | None = None,
    drain_timeout: float = 1.0,
    worker: WorkerThread | None = None,
    submitted: Callable[[PendingCall], object] | None = None,
    **bounding: Unpack[SharedBound],
) -> T: ...


async def run_in_thread(
    fn: Callable[[], T],
    *,
    cancel: Callable[[], object] | None = None,
    drain_timeout: float = 1.0,
    worker: WorkerThread | None = None,
    submitted: Callable[[PendingCall], object] | None = None,
    **bounding: Unpack[BoundArgs],
) -> T:
    """Run ``fn()`` on a worker thread and return its result (or raise its exception).

    Bounded by its :class:`~aio_runtime.BoundArgs` (``awaited``, and either ``error`` with
    ``timeout`` and ``layer``, or ``within``), as every wait is. The bound is checked before the
    thread starts: a call the runtime refuses never runs. ``submitted`` (with ``worker`` only) is
    called with the :class:`PendingCall` as it is handed to the worker: whoever holds it may
    withdraw the call while it is still queued — the call then never runs, and the waiting task
    must be woken by its holder (by cancelling a scope around the wait, say: it then sees that
    cancellation).
    """
    if submitted is not None and worker is None:
        raise ValueError("submitted= is for a call handed to a worker: pass worker= too")
    bound = resolve_bound("run_in_thread", bounding)
    awaited = bounding["awaited"]
    validate_timeout(drain_timeout, what="drain_timeout")
    done: Completion[T] = Completion()
    setter = done.threadsafe_setter()
    context = contextvars.copy_context()
    ledger = current_ledger()
    entry = ledger.open(LedgerKind.WORKER_THREAD, awaited)

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

    ask_to_stop = cancel or _no_stop_request
    stop = ask_to_stop
    withdrawn = False
    if worker is not None:
        call = worker.submit(work)
        if submitted is not None:
            try:
                submitted(call)
            except BaseException:
                if call.withdraw():  # it never runs
                    ledger.close(entry)
                else:  # it started: it keeps its inputs until it returns
                    await drain(done, ask_to_stop, limit=drain_timeout)
                raise

        def withdraw_or_stop() -> None:
            nonlocal withdrawn
            if call.withdraw():  # still queued behind another call: it never runs
                withdrawn = True
                ledger.close(entry)
                done.set_exception(RuntimeError(f"{awaited}: withdrawn before it started"))
            else:
                ask_to_stop()

        stop = withdraw_or_stop
    else:
        threading.Thread(
            target=PendingCall(work).run, name=f"worker: {awaited}", daemon=True
        ).start()
    try:
        return await wait_complete(
            done, awaited=awaited, within=bound, cancel=stop, drain_timeout=drain_timeout
        )
    except BaseException as exc:
        if withdrawn and worker is not None:
            exc.add_note(
                f"it never started: still queued behind an earlier call on {worker.name!r}"
            )
        raise
