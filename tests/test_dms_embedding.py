"""Embedding the DMS service: its public names, where it listens once started, one typed error for
any failure to start, messages that carry the availability member and their reason's kind, and a
user's program that type-checks strictly."""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import pytest
from dms_messages import message
from test_architecture import surface_problems
from test_dms_endpoints import get

import aio_runtime
from aio_runtime import Availability, Reason
from pipelines.cli import main
from pipelines.dms import BoundEndpoints, DmsService, ServiceConfig, StartupError
from pipelines.dms.sinks.zmq import AddressInUse, ZmqSink

ROOT = Path(__file__).resolve().parent.parent
CPU = {"device": "cpu", "calib": (0.0, 0.0, 0.0), "budget": 0.5}
"""The model on the CPU, a static calibration, a budget that no hiccup of a busy machine misses."""


def causes(error: BaseException | None) -> list[BaseException]:
    """``error``, the errors behind it and inside its exception groups."""
    found: list[BaseException] = []
    while error is not None:
        found.append(error)
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                found += causes(inner)
        error = error.__cause__
    return found


# -- the public names --------------------------------------------------------------------------


def test_the_package_lists_exactly_its_public_names():
    assert surface_problems(importlib.import_module("pipelines.dms")) == []


def test_each_public_name_is_the_object_its_module_defines():
    import pipelines.dms as dms
    from pipelines.dms.messages import DriverStateV2
    from pipelines.dms.service import DmsService as Service

    assert dms.DmsService is Service and dms.DriverStateV2 is DriverStateV2
    assert dms.Availability is aio_runtime.Availability
    with pytest.raises(AttributeError, match="has no attribute 'DmsServce'"):
        _ = dms.DmsServce  # type: ignore[attr-defined]


def test_importing_the_package_loads_none_of_the_service():
    heavy = ("pipelines.dms.service", "aio_runtime", "numpy", "zmq", "onnxruntime", "cv2")
    code = f"import sys, pipelines.dms; print([m for m in {heavy!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- where it listens ------------------------------------------------------------------------


def test_the_bound_endpoints_are_frozen_and_printed_one_line_each():
    cereal = ("cereal driverStateV2", "tcp://127.0.0.1:40125")
    bound = BoundEndpoints("127.0.0.1", 40123, (("zmq", "tcp://127.0.0.1:40124"), cereal))
    assert bound.health_url == "http://127.0.0.1:40123/"
    assert bound.zmq == "tcp://127.0.0.1:40124"
    assert bound.cereal == (("driverStateV2", "tcp://127.0.0.1:40125"),)
    assert bound.lines() == [
        "health: http://127.0.0.1:40123/",
        "zmq: tcp://127.0.0.1:40124",
        "cereal driverStateV2: tcp://127.0.0.1:40125",
    ]
    assert BoundEndpoints("::1", 9032).health_url == "http://[::1]:9032/"
    assert BoundEndpoints().lines() == [] and BoundEndpoints().health_url is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        bound.health_port = 1  # type: ignore[misc]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_started_says_where_the_service_listens_as_bound(anyio_backend):
    config = ServiceConfig(health_port=0, zmq="tcp://127.0.0.1:0", **CPU)
    with anyio.fail_after(60):
        async with DmsService(config) as service:
            bound = await service.started()
            assert bound.health_host == "127.0.0.1" and bound.health_port not in (None, 0)
            status, _ = await anyio.to_thread.run_sync(get, f"{bound.health_url}v2/health/live")
            assert status == 200  # the port it said is the one it serves on
            assert bound.zmq is not None and re.fullmatch(r"tcp://127\.0\.0\.1:\d+", bound.zmq)
            assert not bound.zmq.endswith(":0")
            with pytest.raises(AddressInUse):
                ZmqSink(bound.zmq)  # the endpoint it said is the one it bound
            assert await service.started() is bound


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_task_may_wait_for_the_start_and_learns_that_nothing_listens(anyio_backend):
    service = DmsService(ServiceConfig(health_port=None, **CPU))
    got: list[BoundEndpoints] = []
    heard = anyio.Event()

    async def wait() -> None:
        got.append(await service.started())
        heard.set()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert got == []  # not before the service has started
            async with service:
                await heard.wait()
    assert got == [BoundEndpoints()]


def test_aio_dms_run_prints_where_it_listens_at_the_start(capsys):
    main(
        ["run", "--device", "cpu", "--frames", "5", "--calib", "0,0,0", "--budget", "2",
         "--health-port", "0", "--zmq", "tcp://127.0.0.1:0"]
    )  # fmt: skip
    err = capsys.readouterr().err.splitlines()
    health = [line for line in err if line.startswith("health: ")]
    zmq = [line for line in err if line.startswith("zmq: ")]
    assert len(health) == 1 and len(zmq) == 1, err
    port = re.fullmatch(r"health: http://127\.0\.0\.1:(\d+)/", health[0])
    assert port is not None and int(port[1]) != 0
    assert re.fullmatch(r"zmq: tcp://127\.0\.0\.1:[1-9]\d*", zmq[0])


# -- one typed error for any failure to start ---------------------------------------------------


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_port_in_use_is_one_startup_error_for_the_service_and_its_waiters(anyio_backend):
    waited: list[BaseException] = []

    async def wait(service: DmsService) -> None:
        try:
            await service.started()
        except StartupError as exc:
            waited.append(exc)

    with socket.socket() as taken, anyio.fail_after(60):
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = DmsService(ServiceConfig(health_port=port, **CPU))
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, service)
            with pytest.raises(StartupError) as refused:
                async with service:
                    pytest.fail("the service started on a port in use")
    assert refused.value.setting == "health_port" and f"port {port}" in str(refused.value)
    assert isinstance(refused.value.__cause__, OSError)
    assert len(waited) == 1 and isinstance(waited[0], StartupError)
    assert waited[0].setting == "health_port" and waited[0].__cause__ is refused.value


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_zmq_address_in_use_is_a_startup_error_for_the_zmq_setting(anyio_backend):
    taken = ZmqSink("tcp://127.0.0.1:0")
    try:
        with anyio.fail_after(60), pytest.raises(StartupError) as refused:
            async with DmsService(ServiceConfig(zmq=taken.address, health_port=None, **CPU)):
                pytest.fail("the service bound an address in use")
    finally:
        taken.close(timeout=0)
    assert refused.value.setting == "zmq" and isinstance(refused.value.__cause__, AddressInUse)


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="the model's CPUs are placed only on Linux, with two CPUs or more",
)
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_failure_start_up_does_not_name_is_still_one_startup_error(
    anyio_backend, monkeypatch
):
    """A container that refuses CPU placement: the service cannot keep its loop off the model's
    CPU. One StartupError, the refusal behind it — not an exception group."""

    def refuse(pid: int, cpus: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    config = ServiceConfig(model_cpus="auto", health_port=None, **CPU)
    with anyio.fail_after(60), pytest.raises(StartupError) as refused:
        async with DmsService(config):
            pytest.fail("the service started without its CPU placement")
    assert type(refused.value) is StartupError
    assert str(refused.value) == "could not start: [Errno 1] Operation not permitted"
    assert any(isinstance(error, PermissionError) for error in causes(refused.value))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_start_cancelled_stays_a_cancellation_and_a_waiter_hears_of_it(anyio_backend):
    service = DmsService(ServiceConfig(health_port=None, **CPU))
    with anyio.CancelScope() as scope:
        scope.cancel()
        async with service:
            pytest.fail("the service started in a cancelled scope")
    assert scope.cancelled_caught
    with pytest.raises(StartupError, match="stopped before it had started"):
        await service.started()
    with anyio.fail_after(5), pytest.raises(StartupError, match="stopped before it had started"):
        await service.finished()  # it never ran: it never ends, and says so


# -- messages: the availability member and the reason's kind -----------------------------------


def test_a_message_holds_the_availability_member_and_its_reasons_kind():
    invalid, valid = message(valid=False), message()
    assert invalid.availability is Availability.UNAVAILABLE  # given as text, held as the member
    assert invalid.reason_kind == "gpu-queue" and valid.reason_kind is None
    record = json.loads(invalid.to_json())
    assert record["availability"] == "unavailable" and type(record["availability"]) is str
    assert record["reason"].startswith("gpu-queue: ") and record["reasonKind"] == "gpu-queue"
    assert json.loads(valid.to_json())["reasonKind"] is None


def test_a_reason_given_as_a_reason_keeps_the_kind_it_was_given():
    reason = Reason("camera: left", "stalled")  # not read back from its text ("camera")
    changed = dataclasses.replace(message(valid=False), reason=reason)
    assert changed.reason_kind == "camera: left"
    assert changed.to_record()["reasonKind"] == "camera: left"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_messages_and_transitions_speak_the_same_availability(anyio_backend):
    config = ServiceConfig(frames=40, faults="nan-output@15+5", health_port=None, **CPU)
    messages, states = [], []
    with anyio.fail_after(60):
        async with DmsService(config) as service, anyio.create_task_group() as tg:

            async def read_messages() -> None:
                async for published in service.messages():
                    messages.append(published)

            async def read_transitions() -> None:
                with service.transitions() as stream:
                    async for transition in stream:
                        states.append(transition.current)

            tg.start_soon(read_messages)
            tg.start_soon(read_transitions)
            await service.finished()
            tg.cancel_scope.cancel()
    nan = [m for m in messages if m.reason_kind == "invalid output"]
    assert nan and {m.frame_id for m in nan} <= set(range(15, 20))  # dropped ones aside
    assert all(not m.valid and m.reason.startswith("invalid output: ") for m in nan)
    assert all(type(m.availability) is Availability for m in messages)
    assert {m.availability for m in messages} <= {state.availability for state in states}


# -- typed for a user's program ---------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_users_program_and_the_examples_type_check_strictly():
    """``tests/typing/embed_user.py`` uses every public signature of the service and allows no
    expression of type ``Any``; the examples are checked with ``--strict``; and the check finds
    the ``Any`` that ``tests/typing/leaks_any.py`` reaches."""
    programs = ["tests/typing/embed_user.py", "examples/embed_asyncio.py", "examples/embed_trio.py"]
    leak = "tests/typing/leaks_any.py"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *programs, leak],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [line for line in errors if not line.startswith(leak)] == [], result.stdout
    assert any('"Any"' in line for line in errors if line.startswith(leak)), result.stdout
