"""Benchmark: what the simulated accelerator costs a frame beyond the CPU runner, paired.

``--rounds`` rounds (default 7), each one cpu run and one sim run of ``aio-dms run`` of
``--frames`` frames (default 200) in child processes (``--health-port -1``, messages written as
JSON lines to a temporary file), on the machine as it is; per run the model execution time p50
(the messages' ``modelExecutionTime``: the warp and model stages), and sim - cpu as the median of
the rounds' differences (the machine's speed drifts between rounds, so each round pairs its own
two runs). How the service fares on a slow or busy host is ``benchmarks/slow_host.py``'s.

Prints a table, then one JSON line with ``cpu_model_p50_ms``, ``sim_model_p50_ms``,
``sim_minus_cpu_model_p50_ms``, ``failed_runs`` (runs that exited with a status other than 0, or
passed their bound; each reported with the last line of its standard error, under ``failed``, see
:mod:`benchmarks._report`) and ``targets_met``. Target: sim - cpu model execution p50 <= 3 ms.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/copy.py sits beside this file: keep this folder off the import path so that it does
# not stand in for the standard library's ``copy`` module when this runs as a script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import tempfile

from benchmarks._report import Report, median, rounded, run

RUN_TIMEOUT = 600.0
"""Seconds a run may take, at most."""
TARGET_SIM_MINUS_CPU_MS = 3.0


def model_p50_ms(report: Report, device: str, frames: int, what: str) -> float | None:
    """``aio-dms run --device DEVICE --frames FRAMES`` in a child process: its messages' model
    execution time p50 (ms), or None for a run that failed (reported as ``what``)."""
    with tempfile.TemporaryDirectory() as folder:
        messages = Path(folder) / "messages.jsonl"
        command = [
            sys.executable, "-m", "pipelines", "run", "--device", device, "--frames", str(frames),
            "--health-port", "-1", "--jsonl", str(messages), "--log-format", "json",
        ]  # fmt: skip
        done = report.child(what, command, timeout=RUN_TIMEOUT, stdin=subprocess.DEVNULL)
        if done is None or not messages.exists():
            return None
        times = []
        for line in messages.read_text().splitlines():
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if message.get("modelExecutionTime"):
                    times.append(message["modelExecutionTime"] * 1e3)
    return statistics.median(times) if times else None


def main(report: Report) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of a cpu and a sim run")
    parser.add_argument("--frames", type=int, default=200, help="frames per run")
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs; {args.rounds} rounds of a cpu and a sim run of {args.frames} "
        "frames (aio-dms run in a child process), no added load"
    )
    print(f"{'round':>5} {'cpu p50 ms':>10} {'sim p50 ms':>10} {'sim-cpu':>8}")
    cpus: list[float | None] = []
    sims: list[float | None] = []
    for number in range(args.rounds):
        cpus.append(model_p50_ms(report, "cpu", args.frames, f"round {number + 1} cpu"))
        sims.append(model_p50_ms(report, "sim", args.frames, f"round {number + 1} sim"))
        cpu, sim = cpus[-1], sims[-1]
        gap = None if cpu is None or sim is None else sim - cpu
        print(
            f"{number + 1:>5} {'-' if cpu is None else f'{cpu:.2f}':>10} "
            f"{'-' if sim is None else f'{sim:.2f}':>10} {'-' if gap is None else f'{gap:.2f}':>8}"
        )
    paired = median(
        s - c for s, c in zip(sims, cpus, strict=True) if s is not None and c is not None
    )
    print(f"median sim - cpu: {'-' if paired is None else f'{paired:.2f}'} ms (the rounds' median)")
    print(f"\ntarget: sim - cpu model execution p50 <= {TARGET_SIM_MINUS_CPU_MS} ms")
    report.end(
        {
            "cpu_model_p50_ms": rounded(median(cpus), 2),
            "sim_model_p50_ms": rounded(median(sims), 2),
            "sim_minus_cpu_model_p50_ms": rounded(paired, 2),
            "failed_runs": len(report.failed),
        },
        targets_met=paired is not None and paired <= TARGET_SIM_MINUS_CPU_MS,
    )


if __name__ == "__main__":
    run(main)
