"""Benchmark: what a stalled ZeroMQ subscriber costs the publisher, in messages and in memory.

A :class:`~pipelines.dms.sinks.publish.ZmqSink` with its defaults (high-water mark, send buffer) publishes
realistic driverStateV2 messages to ``N`` subscribers (1, 2, 4, 8) in a child process that connect
and never read (each with a receive high-water mark of 1 and a 64 KiB receive buffer, so that
little hides on their side). Publishing goes on until every queue is full (sends fail, counted) and
then 1,000 more. Measured in the publisher, each round in a fresh process (memory once allocated is
not handed back): its resident set growth, the messages accepted (queued for every subscriber
before sends failed), and so the cost per stalled subscriber and per queued message.

Prints a table (medians over rounds), then one JSON line with ``message_bytes``,
``accepted_per_subscriber``, ``mb_per_subscriber`` and ``bytes_per_queued_message`` (and
``failed``: the rounds that failed, each with the last line its process wrote; see
:mod:`benchmarks._report`). ``--subscribers 1`` (comma-separated) measures fewer counts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

import numpy as np

from benchmarks._report import Report, cell, median, ratio, rounded, run
from pipelines.dms.messages import DRIVER_FIELDS, READINESS_LAYERS, DriverStateV2, new_run_id
from pipelines.dms.sinks.zmq import HIGH_WATER_MARK, TOPIC, ZmqSink

SUBSCRIBERS = (1, 2, 4, 8)
BOUND = 60.0
"""Seconds a round may wait for its subscribers to connect, or for their queues to fill."""
ROUND_TIMEOUT = 180.0
"""Seconds a round's process may take, at most."""
RUN_ID = new_run_id()

STALLED = textwrap.dedent(
    """
    import sys, time, zmq
    context = zmq.Context()
    sockets = []
    for _ in range(int(sys.argv[2])):
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.RCVHWM, 1)
        socket.setsockopt(zmq.RCVBUF, 64 * 1024)
        socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
        socket.connect(sys.argv[1])
        sockets.append(socket)
    print("connected", flush=True)
    sys.stdin.read()  # never reads a message; ends when the publisher closes stdin
    """
).replace("TOPIC", repr(TOPIC))


def realistic(seq: int) -> DriverStateV2:
    rng = np.random.default_rng(seq)

    def driver() -> dict[str, object]:
        data: dict[str, object] = {name: float(rng.random()) for name in DRIVER_FIELDS}
        data["faceOrientation"] = rng.random(3).tolist()
        data["faceOrientationStd"] = rng.random(3).tolist()
        data["facePosition"] = rng.random(2).tolist()
        data["facePositionStd"] = rng.random(2).tolist()
        return data

    return DriverStateV2(
        seq=seq,
        run_id=RUN_ID,
        frame_id=seq,
        timestamp_sof=1_700_000_000_000_000_000 + seq * 50_000_000,
        timestamp_eof=1_700_000_000_010_000_000 + seq * 50_000_000,
        frame_age=float(rng.random()) * 0.05,
        availability="available",
        reason="",
        valid=True,
        readiness=dict.fromkeys(READINESS_LAYERS, True),
        model_execution_time=float(rng.random()) * 0.01,
        gpu_execution_time=float(rng.random()) * 0.01,
        wheel_on_right_prob=float(rng.random()),
        left_driver_data=driver(),
        right_driver_data=driver(),
    )


def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def one_round(subscribers: int) -> dict[str, float]:
    """In this process: publish to ``subscribers`` stalled ones until every queue is full."""
    messages = [realistic(seq) for seq in range(64)]
    for m in messages:
        m.to_json()  # encoded once, before the baseline
    sink = ZmqSink("tcp://127.0.0.1:0")
    child = subprocess.Popen(
        [sys.executable, "-c", STALLED, sink.address, str(subscribers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        said = child.stdout.readline().strip()
        if said != "connected":
            raise RuntimeError(f"the subscribers' process said {said!r}, not 'connected'")
        deadline = time.monotonic() + BOUND
        while sink.subscribers < subscribers:  # every connection accepted (the gate counts)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sink.subscribers} of {subscribers} connected in {BOUND:g} s")
            time.sleep(0.01)
        time.sleep(0.5)  # and their subscriptions arrived
        start = sink.stats()
        before = resident()
        seq = 0
        while sink.stats().dropped - start.dropped < 1000:
            if seq % 10_000 == 0 and time.monotonic() > deadline + BOUND:
                raise TimeoutError(f"the queues were not full after {seq} messages")
            sink.publish(messages[seq % len(messages)])
            seq += 1
        grown = resident() - before
        accepted = sink.stats().delivered - start.delivered
    finally:
        child.kill()
        child.wait()
        sink.close(timeout=0)
    return {
        "subscribers": subscribers,
        "message_bytes": statistics.mean(len(m.to_json()) for m in messages),
        "accepted": accepted,
        "grown_mb": grown / 1e6,
    }


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--subscribers", default=",".join(map(str, SUBSCRIBERS)), help="stalled subscribers "
        "per row, comma-separated (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_round(args.one)))
        return
    counts = [int(n) for n in args.subscribers.split(",")]
    rows = []
    for subscribers in counts:
        rounds = []
        for number in range(args.rounds):
            result = report.child_json(
                f"{subscribers} stalled, round {number + 1}",
                [sys.executable, "-m", "benchmarks.zmq_memory", "--one", str(subscribers)],
                timeout=ROUND_TIMEOUT,
            )
            if result is not None:
                rounds.append(result)
        grown = median(r["grown_mb"] for r in rounds)
        accepted = median(r["accepted"] for r in rounds)
        rows.append(
            {
                "subscribers": subscribers,
                "message_bytes": rounds[0]["message_bytes"] if rounds else None,
                "accepted": accepted,
                "grown_mb": grown,
                "mb_per_subscriber": ratio(grown, subscribers),
                "bytes_per_queued_message": ratio(
                    None if grown is None else grown * 1e6,
                    None if accepted is None else subscribers * accepted,
                ),
            }
        )
    print(f"ZmqSink defaults: high-water mark {HIGH_WATER_MARK} messages per subscriber")
    header = f"{'stalled':>8} {'msg B':>7} {'queued':>7} {'RSS +MB':>8} {'MB/sub':>7} {'B/msg':>6}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['subscribers']:>8} {cell(row['message_bytes'], '>7.0f')} "
            f"{cell(row['accepted'], '>7.0f')} {cell(row['grown_mb'], '>8.2f')} "
            f"{cell(row['mb_per_subscriber'], '>7.2f')} "
            f"{cell(row['bytes_per_queued_message'], '>6.0f')}"
        )
    per_message = median(r["bytes_per_queued_message"] for r in rows)
    sizes = median(r["message_bytes"] for r in rows)
    report.end(
        {
            "message_bytes": None if sizes is None else round(sizes),
            "accepted_per_subscriber": median(r["accepted"] for r in rows),
            "mb_per_subscriber": rounded(median(r["mb_per_subscriber"] for r in rows)),
            "bytes_per_queued_message": None if per_message is None else round(per_message),
        }
    )


if __name__ == "__main__":
    run(main)
