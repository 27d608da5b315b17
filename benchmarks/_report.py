"""What every benchmark ends with, whatever happens: its table and its final JSON line.

A missed target is a result (``"targets_met": false``), never a crash. A step that fails — a
child process that exits with a status other than 0, passes its bound or prints no result line, a
measurement that raises — is reported as it happens (``FAILED what: why``; why: the last line of
the child's standard error, or the exception), goes into the JSON line under ``"failed"`` (what:
why) and makes ``targets_met`` false; the benchmark goes on with what it has, a figure it could not
measure being null in the JSON line and ``-`` in the table. A benchmark's ``main`` runs through
:func:`run`, which reports whatever escapes it all the same and prints the JSON line if the
benchmark did not get to.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

__all__ = ["Report", "cell", "last_line", "median", "percentile", "ratio", "rounded", "run"]

T = TypeVar("T")


def last_line(text: str) -> str:
    """The last line of ``text`` that says something ('' if none)."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _why(exc: BaseException) -> str:
    said = last_line(str(exc))
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


class Report:
    """A benchmark's failures as it goes, and its final JSON line (:meth:`end`)."""

    def __init__(self) -> None:
        self.failed: dict[str, str] = {}
        self.ended = False

    def fail(self, what: str, why: str) -> None:
        self.failed[what] = why
        print(f"FAILED {what}: {why}", flush=True)

    def attempt(self, what: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """``call(*args, **kwargs)``, or None where it raised (reported as ``what``)."""
        try:
            return call(*args, **kwargs)
        except Exception as exc:
            self.fail(what, _why(exc))
            return None

    def child(
        self, what: str, argv: Sequence[str], *, timeout: float, **popen: Any
    ) -> subprocess.CompletedProcess[str] | None:
        """``argv`` run to its end within ``timeout`` seconds; None where it could not start,
        passed its bound or exited with a status other than 0 (reported as ``what``, with the
        last line of its standard error)."""
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=timeout, check=False, **popen
            )
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr
            said = last_line(
                stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr or ""
            )
            self.fail(
                what, f"no end within {timeout:g} s" + (f" (last said: {said})" if said else "")
            )
            return None
        except OSError as exc:
            self.fail(what, f"could not start: {exc}")
            return None
        if done.returncode != 0:
            said = last_line(done.stderr) or last_line(done.stdout) or "nothing said"
            self.fail(what, f"exit status {done.returncode}: {said}")
            return None
        return done

    def child_json(
        self, what: str, argv: Sequence[str], *, timeout: float, **popen: Any
    ) -> dict[str, Any] | None:
        """The JSON object a child (:meth:`child`) prints as its last line of standard output;
        None where there is none (reported)."""
        done = self.child(what, argv, timeout=timeout, **popen)
        if done is None:
            return None
        try:
            result = json.loads(last_line(done.stdout))
        except ValueError:
            result = None
        if not isinstance(result, dict):
            said = last_line(done.stderr) or last_line(done.stdout) or "nothing said"
            self.fail(what, f"no result line: {said}")
            return None
        return result

    def end(self, summary: dict[str, Any], targets_met: bool | None = None) -> None:
        """Print the final JSON line: ``summary`` (non-finite numbers as null), ``failed`` when
        anything failed, and — for a benchmark with targets (``targets_met`` given) —
        ``targets_met``, false when anything failed."""
        line = dict(summary)
        if targets_met is not None or "targets_met" in line:
            met = targets_met if targets_met is not None else line["targets_met"]
            line["targets_met"] = bool(met) and not self.failed
        if self.failed:
            line["failed"] = dict(self.failed)
        print(json.dumps(_finite(line), allow_nan=False), flush=True)
        self.ended = True


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if isinstance(value, np.generic):
        return _finite(value.item())
    return value


def run(main: Callable[[Report], int | None]) -> None:
    """Run a benchmark's ``main(report)`` and exit with what it returns (0 for None). What
    escapes it is reported as a failure of the benchmark, with the JSON line if it had not been
    printed yet (``targets_met`` false): the benchmark then exits 0 — it reported."""
    report = Report()
    code: int | None = 0
    try:
        code = main(report)
    except Exception as exc:
        report.fail("benchmark", _why(exc))
        if not report.ended:
            report.end({}, targets_met=False)
    sys.exit(code or 0)


def _numbers(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(v)]


def median(values: Iterable[float | None]) -> float | None:
    """The median of the finite values given, None for none."""
    kept = _numbers(values)
    return statistics.median(kept) if kept else None


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The ``q``-th percentile (numpy's linear) of the finite values given, None for none."""
    kept = _numbers(values)
    return float(np.percentile(kept, q)) if kept else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, None where either is missing or the denominator is 0."""
    if numerator is None or denominator is None or not denominator:
        return None
    value = numerator / denominator
    return value if math.isfinite(value) else None


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def cell(value: float | None, spec: str) -> str:
    """``value`` formatted for a table (``format(value, spec)``), ``-`` where there is none, as
    wide as the spec asks."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width)) if width else "-"
    return format(value, spec)
