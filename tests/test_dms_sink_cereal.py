"""cereal's ZeroMQ rule: a socket per service on the port its name gives, each Event one frame;
loopback unless allowed; a port in use refused; drops counted exactly."""

from __future__ import annotations

import dataclasses
import errno
import socket

import pytest
import zmq
from dms_messages import message

from pipelines.dms.config.kinds import Mode
from pipelines.dms.openpilot.events import DRIVER_STATE, STATUS, read_events
from pipelines.dms.sinks.cereal import (
    CerealSocket,
    cereal_address,
    cereal_port,
    open_cereal_sockets,
)
from pipelines.dms.sinks.zmq import AddressInUse

pytestmark = [pytest.mark.timeout(60)]

PROBE = 1_000_000
"""Messages from this seq on are probes (until a subscription has reached the publisher)."""


def test_the_ports_follow_openpilots_rule():
    assert cereal_port("driverStateV2") == 45495
    assert cereal_port("dmsStatus") == 53156
    # FNV-1a 64-bit: the empty name hashes to the offset basis, "a" to the published vector.
    assert cereal_port("") == 8023 + 0xCBF29CE484222325 % (65535 - 8023)
    assert cereal_port("a") == 8023 + 0xAF63DC4C8601EC8C % (65535 - 8023)


def test_addresses_put_an_ipv6_host_in_brackets():
    assert cereal_address(DRIVER_STATE) == "tcp://127.0.0.1:45495"
    assert cereal_address(STATUS, "::1") == "tcp://[::1]:53156"


@pytest.fixture
def sockets():
    """``connect(port, **options)``: a SUB socket on 127.0.0.1:``port``, subscribed to
    everything, as cereal's subscribers are; all closed after the test."""
    context = zmq.Context()
    made: list[zmq.Socket] = []

    def connect(port, **options):
        sub = context.socket(zmq.SUB)
        made.append(sub)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVTIMEO, 10_000)  # a bound on every receive
        for option, value in options.items():
            sub.setsockopt(getattr(zmq, option), value)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        return sub

    yield connect
    for sub in made:
        sub.close(linger=0)
    context.destroy(linger=0)


def join(sinks, *subs):
    """Probe until every SUB has received a probe (ZeroMQ's slow joiner)."""
    waiting = set(subs)
    for probe in range(PROBE, PROBE + 1000):
        for sink in sinks:
            sink.publish(message(probe))
        for sub in list(waiting):
            if sub.poll(10):
                waiting.discard(sub)
        if not waiting:
            return
    raise AssertionError("a subscriber never joined")


def receive(sub, count):
    """The next ``count`` Events (each a one-frame message), probes left out."""
    found = []
    while len(found) < count:
        frames = sub.recv_multipart()
        assert len(frames) == 1  # the Event's bytes, no topic frame
        [event] = read_events(frames[0])
        member = event.which()
        seq = event.dmsStatus.seq if member == STATUS else event.driverStateV2.frameId - 100
        if seq < PROBE:
            found.append(event)
    return found


def test_a_subscriber_on_45495_receives_driver_states_as_single_frame_events(sockets):
    sinks = open_cereal_sockets()
    try:
        state, status = sinks
        assert (state.service, state.address) == (DRIVER_STATE, "tcp://127.0.0.1:45495")
        assert (status.service, status.address) == (STATUS, "tcp://127.0.0.1:53156")
        driver_states, statuses = sockets(45495), sockets(53156)
        join(sinks, driver_states, statuses)
        stall = dataclasses.replace(message(2, valid=False), frame_id=-1)
        for item in (message(0), message(1), stall, message(3)):
            for sink in sinks:
                sink.publish(item)
        got = receive(driver_states, 3)
        assert [e.which() for e in got] == [DRIVER_STATE] * 3
        assert [e.driverStateV2.frameId for e in got] == [100, 101, 103]
        assert got[0].driverStateV2.leftDriverData.faceProb == pytest.approx(0.25)
        assert [e.dmsStatus.seq for e in receive(statuses, 4)] == [0, 1, 2, 3]
        before = state.stats(), status.stats()
    finally:
        closed = [sink.close(timeout=0) for sink in sinks]
    # The driverStateV2 socket publishes only what has a driverStateV2 Event: not the stall.
    assert before[1].published - before[0].published == 1
    assert [s.name for s in closed] == [
        "cereal driverStateV2 tcp://127.0.0.1:45495",
        "cereal dmsStatus tcp://127.0.0.1:53156",
    ]


def test_a_stalled_subscriber_costs_drops_counted_exactly(sockets):
    sink = CerealSocket(STATUS, delivery=Mode.REPLAY, high_water_mark=20)
    stalled = sockets(53156, RCVHWM=20, RCVBUF=64 * 1024)
    try:
        join([sink], stalled)
        before = sink.stats()
        accepted = []
        for seq in range(3000):
            delivered = sink.stats().delivered
            sink.publish(message(seq))  # never blocks, not even a replay
            if sink.stats().delivered > delivered:
                accepted.append(seq)
        after = sink.stats()
        dropped = after.dropped - before.dropped
        assert after.published - before.published == 3000 and 0 < dropped < 3000
        assert dropped == 3000 - len(accepted)
        assert [e.dmsStatus.seq for e in receive(stalled, len(accepted))] == accepted
    finally:
        stats = sink.close(timeout=0)
    assert stats.published == stats.delivered + stats.dropped


def test_a_port_in_use_is_refused_naming_it_and_nothing_stays_bound():
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past earlier tests' TIME_WAIT
        taken.bind(("127.0.0.1", cereal_port(STATUS)))
        taken.listen()
        with pytest.raises(AddressInUse) as caught:
            open_cereal_sockets()
    assert caught.value.errno == errno.EADDRINUSE and "\n" not in str(caught.value)
    assert "tcp://127.0.0.1:53156" in str(caught.value)
    again = CerealSocket(DRIVER_STATE)  # the socket bound before the failure was closed
    again.close(timeout=0)


@pytest.mark.parametrize("host", ["10.1.2.3", "0.0.0.0", "::"])
def test_a_host_beyond_this_machine_is_refused_unless_allowed(host):
    with pytest.raises(ValueError, match=r"not a loopback address.*allow_remote") as caught:
        open_cereal_sockets(host)
    assert "\n" not in str(caught.value)


def test_a_service_we_do_not_publish_is_refused():
    with pytest.raises(ValueError, match="cereal service must be one of"):
        CerealSocket("carState")
