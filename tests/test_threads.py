"""Blocking calls on worker threads: bounded, typed, and drained before their buffers are reused.

Real time (threads are involved), short durations.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import anyio
import anyio.to_thread
import pytest

from aio_runtime import (
    BudgetExhausted,
    Completion,
    Ledger,
    ModelTimeout,
    UnboundedWaitError,
    UsbTransferTimeout,
    can_run_realtime,
    current_deadline,
    deadline_scope,
    run_in_thread,
    use_ledger,
    wait_complete,
    wait_until,
)

pytestmark = pytest.mark.anyio


async def test_the_result_of_the_blocking_call_is_returned():
    assert await run_in_thread(lambda: 6 * 7, awaited="x", error=ModelTimeout, timeout=5.0) == 42


async def test_the_exception_of_the_blocking_call_is_raised_in_the_task():
    def fails() -> None:
        raise OSError("LIBUSB_ERROR_PIPE")

    with pytest.raises(OSError, match="PIPE"):
        await run_in_thread(fails, awaited="x", error=UsbTransferTimeout, timeout=5.0)


async def test_an_overrunning_call_is_asked_to_stop_and_awaited_before_the_timeout_is_raised():
    stop = threading.Event()
    returned = threading.Event()

    def inference() -> str:
        stop.wait(10.0)  # an onnxruntime run that honours run_options.terminate
        returned.set()
        return "terminated"

    with pytest.raises(ModelTimeout) as info:
        await run_in_thread(
            inference, awaited="model run", error=ModelTimeout, timeout=0.05, cancel=stop.set
        )
    assert returned.is_set()  # the call had returned before the error reached us
    assert info.value.in_flight is False
    assert info.value.elapsed >= 0.05


async def test_a_call_that_ignores_the_stop_request_is_reported_in_flight():
    release = threading.Event()
    try:
        with pytest.raises(UsbTransferTimeout) as info:
            await run_in_thread(
                lambda: release.wait(10.0),
                awaited="pyusb read",
                error=UsbTransferTimeout,
                timeout=0.05,
                cancel=lambda: None,
                drain_timeout=0.05,
            )
        assert info.value.in_flight is True
    finally:
        release.set()


async def test_a_frame_budget_bounds_the_call_too():
    stop = threading.Event()
    with deadline_scope(0.05, name="frame 2"):
        with pytest.raises(BudgetExhausted) as info:
            await run_in_thread(
                lambda: stop.wait(10.0),
                awaited="model run",
                error=ModelTimeout,
                timeout=5.0,
                cancel=stop.set,
            )
    assert info.value.budget == "frame 2"


async def test_cancelling_the_task_stops_and_drains_the_call():
    started, stop, returned = threading.Event(), threading.Event(), threading.Event()

    def call() -> None:
        started.set()
        stop.wait(10.0)
        returned.set()

    scope = anyio.CancelScope()

    async def caller() -> None:
        with scope:
            await run_in_thread(call, awaited="x", error=ModelTimeout, timeout=5.0, cancel=stop.set)

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller)
        await anyio.to_thread.run_sync(started.wait, 10.0)  # cancelled once the call runs
        scope.cancel()
    assert scope.cancelled_caught and returned.is_set()


async def test_without_a_stop_request_the_call_is_still_awaited_before_its_buffer_is_free():
    buffer = bytearray(4)
    returned = threading.Event()

    def pyusb_read() -> None:
        time.sleep(0.05)  # ends by its own libusb timeout; nothing can stop it sooner
        buffer[:] = b"late"
        returned.set()

    with pytest.raises(UsbTransferTimeout) as info:
        await run_in_thread(
            pyusb_read, awaited="pyusb bulk read", error=UsbTransferTimeout, timeout=0.01
        )
    assert returned.is_set()  # the buffer is ours again: the call is over
    assert info.value.in_flight is False


async def test_a_refused_call_never_runs():
    ran = threading.Event()
    with pytest.raises(UnboundedWaitError):
        await run_in_thread(ran.set, awaited="x", error=ModelTimeout)
    with pytest.raises(ValueError):
        await run_in_thread(ran.set, awaited="x", error=ModelTimeout, timeout=1.0, drain_timeout=-1)
    assert not ran.is_set()


async def test_the_call_sees_the_callers_context():
    seen = {}

    def call() -> None:
        seen["deadline"] = current_deadline()

    with deadline_scope(5.0, name="frame 11") as scope:
        await run_in_thread(call, awaited="x", error=ModelTimeout)
    assert seen["deadline"] is scope


async def test_a_call_that_never_returns_stays_in_the_ledger():
    ledger = Ledger()
    release = threading.Event()
    with use_ledger(ledger):
        with pytest.raises(ModelTimeout):
            await run_in_thread(
                lambda: release.wait(10.0),
                awaited="stuck model run",
                error=ModelTimeout,
                timeout=0.01,
                drain_timeout=0.01,
            )
    assert [str(e) for e in ledger.live()] == ["worker thread: stuck model run"]
    release.set()
    with anyio.fail_after(5):
        await wait_until(
            lambda: not ledger.live(), bool, awaited="worker done", error=ModelTimeout, timeout=5.0
        )
    ledger.assert_empty()


async def test_completing_twice_from_a_thread_keeps_the_first_result():
    completion: Completion[int] = Completion()
    setter = completion.threadsafe_setter()

    def twice() -> None:
        setter.set_result(1)
        setter.set_result(2)

    thread = threading.Thread(target=twice)
    thread.start()
    assert await wait_complete(completion, awaited="x", error=ModelTimeout, timeout=5.0) == 1
    thread.join()
    await anyio.sleep(0.01)  # the second hand-off runs on the loop and is dropped quietly
    assert completion.result() == 1


async def test_a_worker_thread_runs_its_calls_in_order_on_one_thread_and_ends_when_closed():
    import threading

    from aio_runtime import WorkerThread

    worker = WorkerThread("test worker")
    names: list[str] = []

    def call(n: int) -> int:
        names.append(threading.current_thread().name)
        return n * 2

    ledger = Ledger()
    with use_ledger(ledger):
        results = [
            await run_in_thread(
                lambda n=n: call(n),
                awaited=f"call {n}",
                error=ModelTimeout,
                worker=worker,
                timeout=5,
            )
            for n in range(3)
        ]
    assert results == [0, 2, 4]
    assert names == ["test worker"] * 3  # no thread started per call
    ledger.assert_empty()
    worker.close()
    thread = worker._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()


async def test_a_call_whose_bound_ends_while_queued_on_a_worker_is_withdrawn_at_once():
    from aio_runtime import WorkerThread

    worker = WorkerThread("busy worker")
    release = threading.Event()
    ran: list[str] = []
    ledger = Ledger()
    with use_ledger(ledger), anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_in_thread(
                    lambda: (release.wait(5), ran.append("first")),
                    awaited="the first call",
                    error=ModelTimeout,
                    timeout=5,
                    worker=worker,
                )
            )
            await anyio.wait_all_tasks_blocked()
            start = time.perf_counter()
            with pytest.raises(ModelTimeout, match="the second call") as info:
                await run_in_thread(
                    lambda: ran.append("second"),
                    awaited="the second call",
                    error=ModelTimeout,
                    timeout=0.05,
                    worker=worker,
                    drain_timeout=2.0,
                )
            elapsed = time.perf_counter() - start
            release.set()
    assert elapsed < 1.0  # not drained: a queued call is taken back, not waited for
    assert "never started: still queued behind an earlier call" in str(info.value.__notes__)
    assert info.value.in_flight is False
    assert ran == ["first"]  # the withdrawn call never ran
    ledger.assert_empty()
    worker.close()


def test_a_withdrawn_call_lets_go_of_what_it_would_have_used_at_once():
    from aio_runtime import WorkerThread

    class Inputs:
        pass

    worker = WorkerThread("busy worker")
    started, release, ran = threading.Event(), threading.Event(), []
    first = worker.submit(lambda: (started.set(), release.wait(5)))
    assert started.wait(5)
    inputs = Inputs()
    released = weakref.ref(inputs)
    queued = worker.submit(lambda inputs=inputs: ran.append(inputs))
    del inputs
    assert queued.withdraw() and not first.withdraw()  # the first one has started
    gc.collect()
    assert released() is None  # not held until the worker reaches the withdrawn call
    release.set()
    worker.close()
    assert worker._thread is not None
    worker._thread.join(5)
    assert ran == []


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
async def test_a_worker_thread_runs_on_the_cpus_it_is_given():
    from aio_runtime import WorkerThread

    cpu = max(os.sched_getaffinity(0))
    worker = WorkerThread("placed", cpus={cpu})
    try:
        seen = await run_in_thread(
            lambda: os.sched_getaffinity(0),
            awaited="affinity",
            error=ModelTimeout,
            timeout=5,
            worker=worker,
        )
    finally:
        worker.close()
    assert seen == {cpu}
    assert os.sched_getaffinity(0) != {cpu}  # the caller's thread is left as it was


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="batch threads are Linux's")
async def test_a_worker_thread_is_a_batch_thread_and_the_callers_thread_is_left_as_it_was():
    from aio_runtime import WorkerThread

    worker = WorkerThread("batch")
    try:
        seen = await run_in_thread(
            lambda: os.sched_getscheduler(0),
            awaited="scheduling policy",
            error=ModelTimeout,
            timeout=5,
            worker=worker,
        )
    finally:
        worker.close()
    assert seen == os.SCHED_BATCH
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


_REALTIME = hasattr(os, "SCHED_FIFO") and can_run_realtime(3) is None


@pytest.mark.skipif(not _REALTIME, reason="this process may not take a real-time priority here")
async def test_inside_realtime_threads_the_caller_and_its_worker_threads_run_at_that_priority():
    from aio_runtime import WorkerThread, realtime_threads

    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    with realtime_threads(3):
        assert os.sched_getscheduler(0) == os.SCHED_FIFO
        worker = WorkerThread("real-time")
        try:
            seen = await run_in_thread(
                lambda: (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority),
                awaited="scheduling policy",
                error=ModelTimeout,
                timeout=5,
                worker=worker,
            )
        finally:
            worker.close()
    assert seen == (os.SCHED_FIFO, 3)
    assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before


def test_a_real_time_priority_this_process_may_not_take_is_said_not_taken(monkeypatch):
    def refused(policy, *args):
        if policy == os.SCHED_FIFO:
            raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", lambda pid, policy, param: refused(policy))
    failure = can_run_realtime(3)
    assert isinstance(failure, PermissionError)
    from pipelines.dms.config.settings import ServiceConfig

    with pytest.raises(ValueError, match=r"^realtime 3: this process may not run threads at a"):
        ServiceConfig(realtime=3, health_port=None).check_environment()


def test_starvation_is_the_longest_wait_of_a_worker_thread_between_two_looks(monkeypatch):
    from aio_runtime import Starvation
    from aio_runtime._core import _starvation

    waits = {11: 1.0, 12: 5.0}
    monkeypatch.setattr(_starvation, "worker_thread_ids", lambda: list(waits))
    monkeypatch.setattr(_starvation, "run_queue_wait", lambda tid=None: waits.get(tid))
    starvation = Starvation()
    assert starvation.since_last() == 0.0  # the first look: nothing to compare
    waits.update({11: 1.02, 12: 5.07, 13: 9.0})  # 13 is new: no earlier reading
    assert starvation.since_last() == pytest.approx(0.07)
    del waits[12]  # ended
    assert starvation.since_last() == pytest.approx(0.0)


async def test_a_call_whose_submitted_hook_fails_is_withdrawn_and_never_runs():
    from aio_runtime import WorkerThread

    ran, gate = threading.Event(), threading.Event()
    ledger = Ledger()
    worker = WorkerThread("test worker")

    def refuse(call):
        raise LookupError("the caller's hook failed")

    try:
        worker.submit(lambda: gate.wait(5.0))  # holds the worker: the next call queues behind it
        with use_ledger(ledger), anyio.fail_after(10):
            with pytest.raises(LookupError):
                await run_in_thread(
                    ran.set,
                    worker=worker,
                    submitted=refuse,
                    awaited="a call",
                    error=ModelTimeout,
                    timeout=5,
                )
            ledger.assert_empty()  # withdrawn: nothing of it is live
            gate.set()
            await run_in_thread(
                lambda: None, worker=worker, awaited="the next call", error=ModelTimeout, timeout=5
            )
        assert not ran.is_set()  # its turn came, and it did not run
    finally:
        gate.set()
        worker.close()


async def test_submitted_is_for_calls_handed_to_a_worker():
    with pytest.raises(ValueError, match="pass worker="):
        await run_in_thread(
            lambda: None, submitted=print, awaited="x", error=ModelTimeout, timeout=1
        )


# -- the interpreter's exit ---------------------------------------------------------------------

EXITING = """
import sys, threading, time
from pathlib import Path
from aio_runtime import WorkerThread

out, started = Path(sys.argv[1]), threading.Event()

def call(n):
    started.set()
    time.sleep(0.2)  # the call still running as the interpreter exits
    with out.open("a") as f:
        f.write(f"{n}\\n")

worker = WorkerThread("exiting")
for n in range(3):
    worker.submit(lambda n=n: call(n))
started.wait(10)
"""


def test_the_interpreter_s_exit_waits_for_the_call_running_and_starts_no_queued_one(tmp_path):
    """A native call returning into a finalised interpreter aborts the process (onnxruntime:
    'terminate called without an active exception'): exit waits for the running call instead,
    and the calls queued behind it never start."""
    import subprocess
    import sys

    out = tmp_path / "calls"
    done = subprocess.run(
        [sys.executable, "-c", EXITING, str(out)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "0\n"


def test_exit_waits_for_running_calls_within_its_grace_only():
    from aio_runtime._core._threads import _Running

    running, release, inside = _Running(), threading.Event(), threading.Event()

    def call() -> None:
        with running.call() as allowed:
            assert allowed
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=call)
    thread.start()
    assert inside.wait(10)
    assert running.wait_at_exit(timeout=0.01) is False  # still running: exit goes on after grace
    with running.call() as allowed:
        assert allowed is False  # exiting: no new call starts
    release.set()
    thread.join(10)
    assert running.wait_at_exit(timeout=10) is True
