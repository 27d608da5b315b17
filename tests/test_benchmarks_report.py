"""What every benchmark ends with, whatever happens (benchmarks/_report.py): a child that fails is
reported with the last line of its standard error, in the table and in the final JSON line, and
the benchmark goes on; what escapes a benchmark is reported, never a traceback."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks._report import Report, cell, median, percentile, ratio, run

pytestmark = [pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parent.parent
CHILD_BOUND = 60.0
"""Seconds a child of these tests may take (an outer bound: each ends at once)."""


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_child_that_fails_is_reported_with_the_last_line_of_its_stderr(capsys):
    report = Report()
    code = "import sys; print('working', file=sys.stderr); sys.exit('the queues never filled')"
    assert report.child("round 1", _python(code), timeout=CHILD_BOUND) is None
    assert report.failed == {"round 1": "exit status 1: the queues never filled"}
    assert "FAILED round 1: exit status 1: the queues never filled" in capsys.readouterr().out


def test_a_child_with_no_result_line_or_past_its_bound_is_reported():
    report = Report()
    assert (
        report.child_json("silent", _python("print('no json here')"), timeout=CHILD_BOUND) is None
    )
    assert report.failed["silent"] == "no result line: no json here"
    assert report.child("slow", _python("import time; time.sleep(600)"), timeout=0.5) is None
    assert report.failed["slow"].startswith("no end within 0.5 s")
    good = report.child_json(
        "good", _python("print('x'); print('{\"a\": 1}')"), timeout=CHILD_BOUND
    )
    assert good == {"a": 1} and "good" not in report.failed


def test_the_json_line_says_what_failed_and_no_target_is_met_then(capsys):
    report = Report()
    report.fail("case cpu", "exit status 1: ImportError: no onnxruntime")
    report.end({"lag_p99_ms": float("nan"), "echo_p99_ms": 0.5}, targets_met=True)
    line = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert line == {
        "lag_p99_ms": None,
        "echo_p99_ms": 0.5,
        "targets_met": False,
        "failed": {"case cpu": "exit status 1: ImportError: no onnxruntime"},
    }


def test_what_escapes_a_benchmark_is_reported_in_its_json_line_not_as_a_traceback(capsys):
    def main(report: Report) -> None:
        print("a table's first row")
        raise ZeroDivisionError("division by zero")

    with pytest.raises(SystemExit) as exited:
        run(main)
    assert exited.value.code == 0  # it reported: make bench goes on
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "a table's first row"
    assert json.loads(out[-1]) == {
        "targets_met": False,
        "failed": {"benchmark": "ZeroDivisionError: division by zero"},
    }


def test_figures_of_nothing_are_none_and_shown_as_a_dash():
    assert median([]) is None and percentile([], 99) is None
    assert median([1.0, float("nan"), 3.0]) == 2.0
    assert ratio(1.0, 0.0) is None and ratio(None, 2.0) is None and ratio(3.0, 2.0) == 1.5
    assert cell(None, ">8.2f") == "       -" and cell(1.5, ">8.2f") == "    1.50"


def test_every_benchmark_ends_through_the_shared_report():
    """Each benchmark's entry point is ``run(main)`` (or its alias): no script can end in a
    traceback of its own."""
    for script in sorted((ROOT / "benchmarks").glob("[!_]*.py")):
        tree = ast.parse(script.read_text())
        entry = next(
            node for node in tree.body
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        )  # fmt: skip
        called = ast.unparse(entry.body[-1])
        assert called in ("run(main)", "run_benchmark(main)"), (script.name, called)


@pytest.mark.timeout(300)
def test_the_zmq_memory_benchmark_measures_a_stalled_subscriber_and_ends_with_its_json_line():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.zmq_memory", "--rounds", "1", "--subscribers", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    line = json.loads(done.stdout.splitlines()[-1])
    assert "failed" not in line, line
    assert line["accepted_per_subscriber"] == 1000  # the high-water mark's worth, then sends fail
    assert line["mb_per_subscriber"] > 0
