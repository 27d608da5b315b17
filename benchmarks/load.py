"""Benchmark: no false alarms — fault-free runs of ``aio-dms run`` beside CPU-bound load.

Three sections, each ``aio-dms run`` in a child process (``--health-port -1``, messages written
as JSON lines to a temporary file, logs as JSON on standard error):

* ``load``: for ``--device cpu`` and ``--device sim``, ``--runs`` runs of ``--frames`` frames
  (default 5 x 600), each beside ``nproc`` copies of ``python3 -c 'while True: pass'`` (default
  priority, unpinned; started before the run and killed after it). A fault-free run should never
  be UNAVAILABLE nor restart its accelerator. Per run: the transitions to UNAVAILABLE once the
  service was first AVAILABLE, the accelerator sessions that failed ("hung": failed because the
  accelerator made no progress), and the share of frames published invalid, by reason kind
  ("frame budget (late)": published late with its output).
* ``interleaved``: on the machine as it is (no added load), ``--rounds`` rounds of one cpu run
  and one sim run of ``--interleaved-frames`` frames; the model execution time p50 (the
  message's ``modelExecutionTime``: the warp and model stages) of each device, and sim - cpu
  (the median of the rounds' differences: the machine's speed drifts between rounds).
* ``default``: ``--default-runs`` runs of ``aio-dms run --duration 10`` (the defaults: the
  simulated accelerator), the share of frames published invalid after the first AVAILABLE one.

Frames before the first AVAILABLE message are the service starting (the model loading, the
recovery hysteresis) and are left out of every share (the default section counts them apart).
Prints a table per section, then one JSON line with ``load`` (per device: UNAVAILABLE transitions
and failed sessions summed over the runs, the median invalid share),
``sim_minus_cpu_model_p50_ms``, ``default_invalid_median_pct``, ``failed_runs`` (runs that
exited with a status other than 0, or passed their bound; each is reported with the last line
of its standard error, under ``failed``, see :mod:`benchmarks._report`) and ``targets_met``
(false where a figure is missing).
Targets: no failed run; 0 UNAVAILABLE transitions and 0 failed sessions under load;
sim - cpu model execution p50 <= 3 ms; default run invalid share median <= 2 %.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import collections
import contextlib
import json
import math
import os
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks._report import Report, last_line, run

FAILED_RUNS: list[Run] = []
"""Runs that exited with a status other than 0: none may, for the targets to be met."""
RUN_TIMEOUT = 600.0
"""Seconds a run may take, at most."""
TARGETS = {"unavailable": 0, "failed_sessions": 0, "sim_minus_cpu_ms": 3.0, "default_pct": 2.0}
HOG = "while True: pass"


@dataclass
class Run:
    """What one ``aio-dms run`` published and logged."""

    device: str
    frames: int = 0
    """Frames published once the service was first AVAILABLE."""
    invalid: collections.Counter[str] = field(default_factory=collections.Counter)
    """Those published invalid, by reason kind."""
    unavailable: int = 0
    """Transitions to UNAVAILABLE once the service was first AVAILABLE."""
    failed_sessions: int = 0
    hung: int = 0
    """Failed sessions whose error says the accelerator made no progress."""
    model_ms: list[float] = field(default_factory=list)
    startup: int = 0
    """Frames published before the first AVAILABLE one: the service starting."""
    exit_code: int = 0

    @property
    def invalid_pct(self) -> float:
        return 100.0 * sum(self.invalid.values()) / self.frames if self.frames else float("nan")

    @property
    def model_p50_ms(self) -> float:
        return statistics.median(self.model_ms) if self.model_ms else float("nan")


def _kind(reason: str) -> str:
    """A reason's kind; a frame published late with its output is told from one without."""
    kind, _, detail = reason.partition(": ")
    return f"{kind} (late)" if detail.startswith("late: ") else kind


def run_service(report: Report, device: str, args: list[str], what: str) -> Run:
    """``aio-dms run --device DEVICE ARGS`` in a child process, read back; one that fails (an
    exit status other than 0, its bound passed) is reported as ``what``."""
    with tempfile.TemporaryDirectory() as folder:
        messages = Path(folder) / "messages.jsonl"
        command = [
            sys.executable, "-m", "pipelines", "run", "--device", device,
            "--health-port", "-1", "--jsonl", str(messages), "--log-format", "json", *args,
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            code, stderr, why = done.returncode, done.stderr, ""
        except subprocess.TimeoutExpired as exc:
            code, stderr = -1, exc.stderr if isinstance(exc.stderr, str) else ""
            why = f"no end within {RUN_TIMEOUT:g} s"
        run = Run(device, exit_code=code)
        if code:
            FAILED_RUNS.append(run)
            report.fail(what, why or f"exit status {code}: {_said(stderr)}")
        if messages.exists():
            _read_messages(run, messages.read_text().splitlines())
    for line in stderr.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict) and event.get("event") == "session failed":
                run.failed_sessions += 1
                run.hung += "no progress" in str(event.get("exception", ""))
    return run


def _said(stderr: str) -> str:
    """What a run's standard error last said: the last log event's text, or its last line."""
    line = last_line(stderr)
    with contextlib.suppress(ValueError, AttributeError):
        event = json.loads(line)
        return str(event.get("exception") or event.get("event") or line).strip().splitlines()[-1]
    return line or "nothing said"


def _read_messages(run: Run, lines: list[str]) -> None:
    up = False
    previous = ""
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a line cut short where the run was stopped
        state = message["availability"]
        if message["frameId"] >= 0 and state == "available":
            up = True
        if up and state == "unavailable" and previous != "unavailable":
            run.unavailable += 1
        previous = state
        if not up:
            run.startup += 1
        if not up or message["frameId"] < 0:
            continue
        run.frames += 1
        if not message["valid"]:
            run.invalid[_kind(message["reason"])] += 1
        if message.get("modelExecutionTime"):
            run.model_ms.append(message["modelExecutionTime"] * 1e3)


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes at default priority, unpinned, for the block."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def _reasons(run: Run) -> str:
    if not run.frames:
        return "no frames"
    shares = (f"{kind} {100 * n / run.frames:.1f}%" for kind, n in run.invalid.most_common())
    return ", ".join(shares) or "-"


def load_section(report: Report, runs: int, frames: int) -> dict[str, dict[str, Any]]:
    hogs = os.cpu_count() or 1
    print(f"\nload: {runs} runs x {frames} frames per device, beside {hogs} CPU-bound processes")
    header = f"{'device':<6} {'run':>3} {'frames':>6} {'unavail':>7} {'failed':>6} {'hung':>4} "
    print(header + f"{'invalid':>7}  by reason kind")
    results: dict[str, list[Run]] = {"cpu": [], "sim": []}
    for device in results:
        for number in range(runs):
            with cpu_hogs(hogs):
                run = run_service(
                    report, device, ["--frames", str(frames)], f"load {device} {number + 1}"
                )
            results[device].append(run)
            print(
                f"{device:<6} {number + 1:>3} {run.frames:>6} {run.unavailable:>7} "
                f"{run.failed_sessions:>6} {run.hung:>4} {run.invalid_pct:>6.1f}%  {_reasons(run)}"
            )
    return {
        device: {
            "unavailable": sum(r.unavailable for r in device_runs),
            "failed_sessions": sum(r.failed_sessions for r in device_runs),
            "hung": sum(r.hung for r in device_runs),
            "invalid_pct_median": _finite(statistics.median(r.invalid_pct for r in device_runs)),
            "model_p50_ms": _finite(statistics.median(r.model_p50_ms for r in device_runs)),
        }
        for device, device_runs in results.items()
    }


def interleaved_section(report: Report, rounds: int, frames: int) -> dict[str, float | None]:
    print(
        f"\ninterleaved: {rounds} rounds of a cpu and a sim run of {frames} frames, no added load"
    )
    print(f"{'round':>5} {'cpu p50 ms':>10} {'sim p50 ms':>10} {'sim-cpu':>8}")
    p50s: dict[str, list[float]] = {"cpu": [], "sim": []}
    for number in range(rounds):
        for device in p50s:
            what = f"interleaved {device} {number + 1}"
            p50s[device].append(
                run_service(report, device, ["--frames", str(frames)], what).model_p50_ms
            )
        cpu, sim = p50s["cpu"][-1], p50s["sim"][-1]
        print(f"{number + 1:>5} {cpu:>10.2f} {sim:>10.2f} {sim - cpu:>8.2f}")
    cpu, sim = statistics.median(p50s["cpu"]), statistics.median(p50s["sim"])
    paired = statistics.median(s - c for s, c in zip(p50s["sim"], p50s["cpu"], strict=True))
    print(f"{'median':>5} {cpu:>10.2f} {sim:>10.2f} {paired:>8.2f}  (sim-cpu: the rounds' median)")
    return {
        "cpu_model_p50_ms": _finite(cpu),
        "sim_model_p50_ms": _finite(sim),
        "sim_minus_cpu_model_p50_ms": _finite(paired),
    }


def default_section(report: Report, runs: int) -> float:
    print(f"\ndefault: {runs} runs of aio-dms run --duration 10 (the simulated accelerator)")
    print(f"{'run':>3} {'start-up':>8} {'frames':>6} {'invalid':>7}  by reason kind")
    shares = []
    for number in range(runs):
        run = run_service(report, "sim", ["--duration", "10"], f"default {number + 1}")
        shares.append(run.invalid_pct)
        print(
            f"{number + 1:>3} {run.startup:>8} {run.frames:>6} {run.invalid_pct:>6.1f}%  "
            f"{_reasons(run)}"
        )
    return statistics.median(shares)


def _finite(value: float) -> float | None:
    """A figure for the JSON line: None where there is none (JSON has no NaN)."""
    return None if math.isnan(value) else round(value, 2)


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="loaded runs per device")
    parser.add_argument("--frames", type=int, default=600, help="frames per loaded run")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--interleaved-frames", type=int, default=200)
    parser.add_argument("--default-runs", type=int, default=5, help="runs of --duration 10")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; each run: aio-dms run in a child process")
    load = load_section(report, args.runs, args.frames) if args.runs else {}
    interleaved = (
        interleaved_section(report, args.rounds, args.interleaved_frames) if args.rounds else {}
    )
    default = default_section(report, args.default_runs) if args.default_runs else float("nan")
    paired = interleaved.get("sim_minus_cpu_model_p50_ms")
    difference = math.nan if paired is None else paired
    summary = {
        "load": load,
        **interleaved,
        "default_invalid_median_pct": _finite(default),
        "failed_runs": len(FAILED_RUNS),
    }
    met = (
        not FAILED_RUNS
        and all(
            device["unavailable"] <= TARGETS["unavailable"]
            and device["failed_sessions"] <= TARGETS["failed_sessions"]
            for device in load.values()
        )
        and difference <= TARGETS["sim_minus_cpu_ms"]
        and default <= TARGETS["default_pct"]
    )
    print(f"\ntargets: {TARGETS}")
    report.end(summary, targets_met=met)


if __name__ == "__main__":
    run(main)
