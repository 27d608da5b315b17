"""The ZeroMQ sink: addresses checked up front, exact counts past a full queue, a subscriber cap."""

from __future__ import annotations

import errno
import json
import select
import socket as sockets
import subprocess
import sys
import textwrap
import time

import anyio
import pytest
import zmq
from dms_messages import message
from zmq.utils.monitor import recv_monitor_message

from pipelines.dms.config.kinds import Mode
from pipelines.dms.config.values import check_zmq_address
from pipelines.dms.sinks.zmq import MAX_SUBSCRIBERS, TOPIC, AddressInUse, ZmqSink

pytestmark = [pytest.mark.timeout(60)]

PROBE = 1_000_000
"""Messages from this seq on are probes (until a subscription has reached the publisher)."""


@pytest.fixture
def subscriber():
    """``subscriber(address, **options)``: a SUB socket on ``address``, closed after the test."""
    context = zmq.Context()
    sockets: list[zmq.Socket] = []

    def connect(address, *, subscribe=True, **options):
        socket = context.socket(zmq.SUB)
        sockets.append(socket)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, 10_000)  # a bound on every receive
        for option, value in options.items():
            socket.setsockopt(getattr(zmq, option), value)
        if subscribe:
            socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
            socket.connect(address)
        return socket

    yield connect
    for socket in sockets:
        socket.close(linger=0)
    context.destroy(linger=0)


def join(sink, *sockets):
    """Probe until every socket has received a probe (ZeroMQ's slow joiner), then read the
    probes still on their way; later messages reach all of them."""
    waiting = set(sockets)
    for probe in range(PROBE, PROBE + 1000):
        sink.publish(message(probe))
        for socket in list(waiting):
            if socket.poll(10):
                waiting.discard(socket)
        if not waiting:
            return
    raise AssertionError("a subscriber never joined")


def receive(socket, count):
    """The next ``count`` messages' seqs, probes left out."""
    seqs: list[int] = []
    while len(seqs) < count:
        topic, body = socket.recv_multipart()
        assert topic == TOPIC
        seq = json.loads(body)["seq"]
        if seq < PROBE:
            seqs.append(seq)
    return seqs


@pytest.mark.parametrize(
    ("address", "complaint"),
    [
        ("garbage", "expected tcp://HOST:PORT, ipc://PATH or inproc://NAME"),
        ("udp://127.0.0.1:9031", "expected tcp://HOST:PORT"),
        ("tcp://127.0.0.1:99999", "port '99999' is not 0-65535"),
        ("tcp://127.0.0.1:-1", "port '-1' is not 0-65535"),
        ("tcp://127.0.0.1:http", "port 'http' is not 0-65535"),
        ("tcp://127.0.0.1", "port '127.0.0.1' is not|expected tcp://HOST:PORT"),
        ("tcp://:9031", "expected tcp://HOST:PORT"),
        ("tcp://bad_host!:9031", "is not a host"),
        ("ipc://" + "x" * 120, "at most 107 bytes"),
        ("tcp://0.0.0.0:0", "not a loopback address"),
        ("tcp://*:0", "not a loopback address"),
        ("tcp://192.0.2.1:9031", "not a loopback address"),
    ],
)
def test_a_bad_address_is_refused_up_front_in_one_line(address, complaint):
    with pytest.raises(ValueError, match=complaint) as caught:
        ZmqSink(address)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("address", "allow_remote"),
    [
        ("tcp://127.0.0.1:0", False),
        ("tcp://localhost:*", False),
        ("tcp://[::1]:9031", False),
        ("ipc:///tmp/dms.ipc", False),
        ("inproc://dms", False),
        ("tcp://0.0.0.0:0", True),
        ("tcp://*:9031", True),
    ],
)
def test_good_addresses_pass_the_check(address, allow_remote):
    assert check_zmq_address(address, allow_remote=allow_remote) == address


@pytest.mark.parametrize("address", ["tcp://localhost:*", "tcp://[::1]:0", "ipc", "inproc://dms"])
def test_each_kind_of_loopback_address_binds(address, tmp_path):
    if address == "ipc":
        address = f"ipc://{tmp_path}/dms.ipc"
    sink = ZmqSink(address)
    try:
        assert sink.address.split("://")[0] == address.split("://")[0]
        assert not sink.address.endswith((":*", ":0"))  # the port chosen
    finally:
        sink.close(timeout=0)


def test_an_address_in_use_is_an_os_error_that_names_it():
    first = ZmqSink("tcp://127.0.0.1:0")
    try:
        with pytest.raises(AddressInUse) as caught:
            ZmqSink(first.address)
        assert isinstance(caught.value, OSError) and caught.value.errno == errno.EADDRINUSE
        assert first.address in str(caught.value)
    finally:
        first.close()


SUBSCRIBER = textwrap.dedent(
    """
    import json, sys, zmq
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"driverStateV2")
    socket.setsockopt(zmq.RCVTIMEO, 10000)
    socket.connect(sys.argv[1])
    seen, joined = [], False
    while len(seen) < 3:
        topic, body = socket.recv_multipart()
        seq = json.loads(body)["seq"]
        if seq >= 1000:  # a probe: the subscription has reached the publisher
            if not joined:
                print("joined", flush=True)
                joined = True
            continue
        seen.append(seq)
    print(json.dumps(seen), flush=True)
    """
)


def test_zeromq_reaches_a_subscriber_in_another_process():
    sink = ZmqSink("tcp://127.0.0.1:0")
    child = subprocess.Popen(
        [sys.executable, "-c", SUBSCRIBER, sink.address], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        # ZeroMQ's slow joiner: probe until the subscriber says a probe arrived.
        for probe in range(1000, 2000):
            sink.publish(message(probe))
            if select.select([child.stdout], [], [], 0.01)[0]:
                break
        assert child.stdout.readline().strip() == "joined"
        for seq in range(3):
            sink.publish(message(seq))
        out, _ = child.communicate(timeout=15)
        assert json.loads(out.strip()) == [0, 1, 2]
    finally:
        child.kill()
        sink.close()


def test_a_stalled_subscriber_makes_sends_fail_counted_exactly_for_every_subscriber(
    subscriber, captured_logs
):
    """XPUB_NODROP: a message goes to every subscriber or to none. The stalled one and the healthy
    one beside it both receive exactly the messages counted as delivered, in order."""
    sink = ZmqSink("tcp://127.0.0.1:0", delivery=Mode.REPLAY, high_water_mark=20)
    stalled = subscriber(sink.address, RCVHWM=20, RCVBUF=64 * 1024)
    healthy = subscriber(sink.address)
    try:
        join(sink, stalled, healthy)
        before = sink.stats()
        accepted, seen_by_healthy = [], []
        for seq in range(3000):
            anyio.run(sink.room)  # never holds, not even a replay
            delivered = sink.stats().delivered
            sink.publish(message(seq))
            if sink.stats().delivered > delivered:
                accepted.append(seq)
            while healthy.poll(0):
                _, body = healthy.recv_multipart()
                if (got := json.loads(body)["seq"]) < PROBE:
                    seen_by_healthy.append(got)
        after = sink.stats()
        sent = after.published - before.published
        dropped = after.dropped - before.dropped
        assert sent == 3000 and 0 < dropped < 3000
        assert receive(stalled, len(accepted)) == accepted  # it reads again: exactly these
        assert dropped == sent - len(accepted)
        seen_by_healthy += receive(healthy, len(accepted) - len(seen_by_healthy))
        assert seen_by_healthy == accepted  # the same gaps as the stalled one's
        for attempt in range(100):  # nothing else was queued: the next message is the next one
            sink.publish(message(5000 + attempt))
            if sink.stats().delivered > after.delivered:
                break
        assert receive(stalled, 1) == receive(healthy, 1) == [5000 + attempt]
    finally:
        stats = sink.close(timeout=0)
    # Logged per episode (a few while the kernel's buffers fill, the queue emptying in bursts):
    # each start has its stop, and the stops count every drop.
    episodes = [
        e for e in captured_logs if e["event"].startswith("sink ") and "dropp" in e["event"]
    ]
    assert [e["event"] for e in episodes] == [
        "sink dropping messages",
        "sink stopped dropping",
    ] * (len(episodes) // 2)
    assert episodes and all(e["log_level"] == "warning" for e in episodes)
    assert sum(e["dropped"] for e in episodes[1::2]) == stats.dropped


def test_a_subscriber_past_the_cap_is_refused_and_the_others_are_served(subscriber, captured_logs):
    sink = ZmqSink("tcp://127.0.0.1:0", max_subscribers=1)
    first = subscriber(sink.address)
    try:
        join(sink, first)
        second = subscriber(sink.address, subscribe=False)
        monitor = second.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        monitor.setsockopt(zmq.RCVTIMEO, 10_000)
        second.setsockopt(zmq.SUBSCRIBE, TOPIC)
        second.connect(sink.address)
        event = recv_monitor_message(monitor)  # told, in the handshake
        assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH and event["value"] == 400
        assert sink.refused == 1
        [refused] = [e for e in captured_logs if e["event"] == "zmq subscriber refused"]
        assert refused["max_subscribers"] == 1 and refused["log_level"] == "warning"
        sink.publish(message(7))
        assert receive(first, 1) == [7]
        assert not second.poll(100)
        second.disable_monitor()
        monitor.close(linger=0)
    finally:
        sink.close(timeout=0)


BOUND = 30.0
"""Seconds within which every subscriber of a test has been served or refused (an outer bound:
the tests wait for events, never for time to pass)."""


class _Subscribers:
    """SUB sockets connecting to ``address`` all at once, each with a monitor that says whether
    it was refused (HANDSHAKE_FAILED_AUTH, 400)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.context = zmq.Context()
        self.sockets: list[zmq.Socket] = []
        self.monitors: dict[zmq.Socket, zmq.Socket] = {}

    def connect(self, count: int) -> list[zmq.Socket]:
        added = []
        for _ in range(count):
            socket = self.context.socket(zmq.SUB)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
            self.monitors[socket] = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
            added.append(socket)
        for socket in added:  # the burst: every connect before any handshake is answered
            socket.connect(self.address)
        self.sockets += added
        return added

    def outcome(self, sink: ZmqSink, sockets: list[zmq.Socket]) -> tuple[set, set]:
        """Probe until each of ``sockets`` has received a message (served) or been refused;
        (served, refused), both sets of sockets."""
        served: set[zmq.Socket] = set()
        refused: set[zmq.Socket] = set()
        poller = zmq.Poller()
        for socket in sockets:
            poller.register(socket, zmq.POLLIN)
            poller.register(self.monitors[socket], zmq.POLLIN)
        by_monitor = {self.monitors[socket]: socket for socket in sockets}
        deadline = time.monotonic() + BOUND
        probe = PROBE
        while len(served) + len(refused) < len(sockets):
            assert time.monotonic() < deadline, f"{len(served)} served, {len(refused)} refused"
            sink.publish(message(probe))
            probe += 1
            for ready, _ in poller.poll(10):
                if ready in by_monitor:
                    event = recv_monitor_message(ready)
                    assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    assert event["value"] == 400
                    refused.add(by_monitor[ready])
                    poller.unregister(ready)
                else:
                    ready.recv_multipart()
                    served.add(ready)
                    poller.unregister(ready)
        assert not served & refused
        return served, refused

    def close(self, socket: zmq.Socket) -> None:
        socket.disable_monitor()
        self.monitors.pop(socket).close(linger=0)
        socket.close(linger=0)
        self.sockets.remove(socket)

    def close_all(self) -> None:
        for socket in list(self.sockets):
            self.close(socket)
        self.context.destroy(linger=0)


def until(condition, sink: ZmqSink) -> None:
    """Wait (bounded) for ``condition()`` about the sink's connections, which its gate's thread
    counts: probing on, each probe a chance for that thread to run."""
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline
        sink.publish(message(PROBE))
        zmq.Poller().poll(1)


@pytest.fixture
def burst():
    """``burst(sink)``: subscribers for ``sink``, closed after the test."""
    made: list[_Subscribers] = []

    def make(sink: ZmqSink) -> _Subscribers:
        made.append(_Subscribers(sink.address))
        return made[-1]

    yield make
    for subscribers in made:
        subscribers.close_all()


@pytest.mark.parametrize("count", [9, 21])
def test_a_burst_of_subscribers_has_the_first_eight_served_and_the_rest_refused_counted(
    count, burst
):
    """However the connections' events and their handshakes interleave, exactly the cap is
    served, each of the others is told (400 in its handshake) and counted."""
    sink = ZmqSink("tcp://127.0.0.1:0")
    try:
        subscribers = burst(sink)
        served, refused = subscribers.outcome(sink, subscribers.connect(count))
        assert len(served) == MAX_SUBSCRIBERS == 8
        assert len(refused) == count - MAX_SUBSCRIBERS == sink.refused
        until(lambda: sink.subscribers == MAX_SUBSCRIBERS, sink)  # the refused have gone
        assert sink.refused == count - MAX_SUBSCRIBERS
    finally:
        sink.close(timeout=0)


def test_a_subscriber_that_leaves_frees_its_place_for_a_later_one(burst):
    sink = ZmqSink("tcp://127.0.0.1:0")
    try:
        subscribers = burst(sink)
        served, refused = subscribers.outcome(sink, subscribers.connect(MAX_SUBSCRIBERS + 1))
        assert (len(served), len(refused)) == (MAX_SUBSCRIBERS, 1)
        until(lambda: sink.subscribers == MAX_SUBSCRIBERS, sink)
        subscribers.close(served.pop())
        until(lambda: sink.subscribers == MAX_SUBSCRIBERS - 1, sink)
        newcomer = subscribers.connect(1)
        assert subscribers.outcome(sink, newcomer) == (set(newcomer), set())
        later, refused_later = subscribers.outcome(sink, subscribers.connect(1))
        assert not later and len(refused_later) == 1 and sink.refused == 2
    finally:
        sink.close(timeout=0)


def _greeting_only(address: str) -> sockets.socket:
    """A TCP peer that sends ZMTP 3.0's greeting for the NULL mechanism and waits (bounded) for
    the publisher's READY: admitted, its handshake not finished (it never sends its own READY)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    peer = sockets.create_connection((host, int(port)), timeout=BOUND)
    signature, version, mechanism = (
        b"\xff" + bytes(8) + b"\x7f",
        b"\x03\x00",
        b"NULL".ljust(20, b"\0"),
    )
    peer.sendall(signature + version + mechanism + bytes(32))  # as-server 0, then the filler
    received = b""
    while b"READY" not in received:
        chunk = peer.recv(4096)
        assert chunk and b"ERROR" not in chunk, received + chunk
        received += chunk
    return peer


def test_a_subscriber_whose_handshake_fails_after_admission_frees_its_place(burst):
    sink = ZmqSink("tcp://127.0.0.1:0", max_subscribers=2)
    try:
        for _ in range(3):  # each admitted, then gone mid-handshake
            _greeting_only(sink.address).close()
            until(lambda: sink.subscribers == 0, sink)
        subscribers = burst(sink)
        served, refused = subscribers.outcome(sink, subscribers.connect(3))
        assert (len(served), len(refused)) == (2, 1)
    finally:
        sink.close(timeout=0)


def test_a_connection_still_in_its_handshake_takes_no_place(burst):
    """A peer that connects and says nothing has not asked to subscribe: a burst beside it is
    served in full."""
    sink = ZmqSink("tcp://127.0.0.1:0")
    host, port = sink.address.removeprefix("tcp://").rsplit(":", 1)
    silent = sockets.create_connection((host, int(port)), timeout=BOUND)
    try:
        until(lambda: sink.subscribers == 1, sink)
        subscribers = burst(sink)
        served, refused = subscribers.outcome(sink, subscribers.connect(MAX_SUBSCRIBERS))
        assert (len(served), len(refused)) == (MAX_SUBSCRIBERS, 0)
        silent.close()
        until(lambda: sink.subscribers == MAX_SUBSCRIBERS, sink)
        assert subscribers.outcome(sink, subscribers.connect(1))[1]  # still full
    finally:
        silent.close()
        sink.close(timeout=0)


def test_a_closed_sink_counts_what_it_is_still_given():
    sink = ZmqSink("inproc://closed")
    sink.publish(message(0))
    stats = sink.close()
    sink.publish(message(1))
    assert (stats.published, stats.delivered, stats.dropped) == (1, 1, 0)
    later = sink.stats()
    assert (later.published, later.delivered, later.dropped, later.pending) == (2, 1, 1, 0)
    assert anyio.run(sink.wait_failure) is None


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [({"high_water_mark": 0}, "high_water_mark"), ({"max_subscribers": 0}, "max_subscribers")],
)
def test_bounds_that_bound_nothing_are_refused(arguments, complaint):
    with pytest.raises(ValueError, match=complaint):
        ZmqSink("tcp://127.0.0.1:0", **arguments)
