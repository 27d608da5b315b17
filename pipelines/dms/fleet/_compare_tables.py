"""What a fleet comparison found, as figures, tables, files and text.

:class:`FleetComparison` holds one :class:`FieldStats` per driver column and one
:class:`RecordingStats` per recording; :func:`write_comparison` writes them as ``fields.parquet``
(:data:`FIELD_COLUMNS`, one row a field), ``recordings.parquet`` (:data:`RECORDING_COLUMNS`, one
row a recording, in the comparison's order) and ``comparison.json`` (the same rows under
``fields`` and ``recordings``, with the same keys, and the totals). A figure that is not a finite
number is null in the files (an undefined one, or an infinite |d|: see :mod:`.compare`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import replace_whole
from ..openpilot.policy import DECISIONS

__all__ = [
    "COMPARISON_FILES",
    "FIELD_COLUMNS",
    "HISTOGRAM_BINS",
    "RECORDING_COLUMNS",
    "FieldStats",
    "FleetComparison",
    "RecordingStats",
    "read_comparison",
    "write_comparison",
]

HISTOGRAM_BINS = 41
"""Bins of each field's histogram of differences (odd: a difference of 0 is a bin's middle)."""
_FIELD_TYPES = (
    ("field", "string"),
    ("count", "int64"),
    ("mean", "float64"),
    ("meanAbs", "float64"),
    ("p50Abs", "float64"),
    ("p90Abs", "float64"),
    ("p99Abs", "float64"),
    ("maxAbs", "float64"),
    ("nonFinite", "int64"),
    ("histogramEdges", "list<float64>"),
    ("histogramCounts", "list<int64>"),
)
_RECORDING_TYPES = (
    ("recording", "string"),
    ("frames", "int64"),
    ("compared", "int64"),
    ("onlyBaseline", "int64"),
    ("onlyCandidate", "int64"),
    ("meanAbs", "float64"),
    *((f"flips.{name}", "int64") for name in DECISIONS),
    *((f"flipShare.{name}", "float64") for name in DECISIONS),
    ("maxFlipShare", "float64"),
    ("maxFlipDecision", "string"),
)
FIELD_COLUMNS = tuple(name for name, _ in _FIELD_TYPES)
"""The columns of ``fields.parquet``."""
RECORDING_COLUMNS = tuple(name for name, _ in _RECORDING_TYPES)
"""The columns of ``recordings.parquet``."""
COMPARISON_FILES = ("fields.parquet", "recordings.parquet", "comparison.json")
"""What :func:`write_comparison` writes, in the order it writes them."""


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _read_float(value: Any, *, defined: bool) -> float:
    """A figure back from JSON: null is NaN when it was undefined, else an infinite |d|."""
    if value is None:
        return math.inf if defined else math.nan
    return float(value)


@dataclass(frozen=True)
class FieldStats:
    """One driver column's differences d = candidate - baseline over the compared frames."""

    field: str
    count: int
    mean: float
    """NaN when there is no compared frame or a difference is not finite."""
    mean_abs: float
    p50_abs: float
    p90_abs: float
    p99_abs: float
    max_abs: float
    non_finite: int
    """Differences that are not finite (counted as an infinite |d|, not in the histogram)."""
    edges: tuple[float, ...]
    """The histogram's bin edges (one more than its counts; empty with no compared frame)."""
    counts: tuple[int, ...]

    def to_record(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "count": self.count,
            **{
                key: _finite(value)
                for key, value in (
                    ("mean", self.mean),
                    ("meanAbs", self.mean_abs),
                    ("p50Abs", self.p50_abs),
                    ("p90Abs", self.p90_abs),
                    ("p99Abs", self.p99_abs),
                    ("maxAbs", self.max_abs),
                )
            },
            "nonFinite": self.non_finite,
            "histogramEdges": list(self.edges),
            "histogramCounts": list(self.counts),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> FieldStats:
        defined = int(record["count"]) > 0
        return cls(
            field=str(record["field"]),
            count=int(record["count"]),
            mean=_read_float(record["mean"], defined=False),
            **{
                name: _read_float(record[key], defined=defined)
                for name, key in (
                    ("mean_abs", "meanAbs"),
                    ("p50_abs", "p50Abs"),
                    ("p90_abs", "p90Abs"),
                    ("p99_abs", "p99Abs"),
                    ("max_abs", "maxAbs"),
                )
            },
            non_finite=int(record["nonFinite"]),
            edges=tuple(float(edge) for edge in record["histogramEdges"]),
            counts=tuple(int(n) for n in record["histogramCounts"]),
        )


@dataclass(frozen=True)
class RecordingStats:
    """One recording: its frames in both runs, in one only, compared, and the decisions that
    flipped on its compared frames."""

    recording: str
    frames: int
    """Frames in both runs (compared or not: a frame without driver data is not)."""
    compared: int
    only_baseline: int
    only_candidate: int
    mean_abs: float
    """|d| over every driver column and compared frame, averaged (NaN with none compared)."""
    flips: Mapping[str, int]
    """Per decision (:data:`~pipelines.dms.openpilot.policy.DECISIONS`), the compared frames
    where the two runs decide differently."""

    @property
    def flip_shares(self) -> dict[str, float | None]:
        """Per decision, the share of the compared frames that flip (None with none compared)."""
        return {
            name: (self.flips[name] / self.compared if self.compared else None)
            for name in DECISIONS
        }

    @property
    def max_flip_share(self) -> float | None:
        shares = [share for share in self.flip_shares.values() if share is not None]
        return max(shares) if shares else None

    @property
    def max_flip_decision(self) -> str | None:
        """The decision that flips most often (the first of equals); None when none flips."""
        largest = max(self.flips.values(), default=0)
        return next((n for n in DECISIONS if self.flips[n] == largest), None) if largest else None

    def to_record(self) -> dict[str, Any]:
        return {
            "recording": self.recording,
            "frames": self.frames,
            "compared": self.compared,
            "onlyBaseline": self.only_baseline,
            "onlyCandidate": self.only_candidate,
            "meanAbs": _finite(self.mean_abs),
            **{f"flips.{name}": self.flips[name] for name in DECISIONS},
            **{f"flipShare.{name}": share for name, share in self.flip_shares.items()},
            "maxFlipShare": self.max_flip_share,
            "maxFlipDecision": self.max_flip_decision,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> RecordingStats:
        compared = int(record["compared"])
        return cls(
            recording=str(record["recording"]),
            frames=int(record["frames"]),
            compared=compared,
            only_baseline=int(record["onlyBaseline"]),
            only_candidate=int(record["onlyCandidate"]),
            mean_abs=_read_float(record["meanAbs"], defined=compared > 0),
            flips={name: int(record[f"flips.{name}"]) for name in DECISIONS},
        )


@dataclass(frozen=True)
class FleetComparison:
    """What :func:`~.compare.compare_runs` found: the fields in the driver columns' order, the
    recordings in the comparison's order (largest flip share first)."""

    baseline: Path
    candidate: Path
    rows_baseline: int
    rows_candidate: int
    fields: tuple[FieldStats, ...]
    recordings: tuple[RecordingStats, ...]

    @property
    def compared(self) -> int:
        return sum(r.compared for r in self.recordings)

    @property
    def flip_shares(self) -> dict[str, float | None]:
        """Per decision, the share of all compared frames that flip (None with none compared)."""
        total = self.compared
        return {
            name: (sum(r.flips[name] for r in self.recordings) / total if total else None)
            for name in DECISIONS
        }

    def fields_by_change(self) -> list[FieldStats]:
        """The fields, the largest mean |d| first (undefined ones last), then by name."""
        return sorted(
            self.fields,
            key=lambda f: (-f.mean_abs if not math.isnan(f.mean_abs) else math.inf, f.field),
        )

    def to_record(self) -> dict[str, Any]:
        """The comparison as one JSON document (no NaN or infinity in it)."""
        return {
            "baseline": str(self.baseline),
            "candidate": str(self.candidate),
            "rows": {"baseline": self.rows_baseline, "candidate": self.rows_candidate},
            "compared": self.compared,
            "flipShare": self.flip_shares,
            "fields": [f.to_record() for f in self.fields],
            "recordings": [r.to_record() for r in self.recordings],
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> FleetComparison:
        return cls(
            baseline=Path(record["baseline"]),
            candidate=Path(record["candidate"]),
            rows_baseline=int(record["rows"]["baseline"]),
            rows_candidate=int(record["rows"]["candidate"]),
            fields=tuple(FieldStats.from_record(f) for f in record["fields"]),
            recordings=tuple(RecordingStats.from_record(r) for r in record["recordings"]),
        )

    def table(self, fields: int = 8, recordings: int = 10) -> str:
        """A short text table: the totals, the ``fields`` fields that moved most (by mean |d|),
        the first ``recordings`` recordings (largest flip share first)."""
        only_a = sum(r.only_baseline for r in self.recordings)
        only_b = sum(r.only_candidate for r in self.recordings)
        shares = ", ".join(f"{name} {_share(s)}" for name, s in self.flip_shares.items())
        lines = [
            f"baseline (A): {self.baseline}   candidate (B): {self.candidate}",
            f"rows: A {self.rows_baseline}, B {self.rows_candidate}; compared {self.compared} "
            f"frames of {len(self.recordings)} recordings (only in A {only_a}, only in B "
            f"{only_b})",
            f"flip share: {shares}",
            "",
            f"{'field (B - A)':<28} {'mean |d|':>10} {'p99 |d|':>10} {'max |d|':>10} "
            f"{'mean d':>10}",
        ]
        lines += [
            f"{f.field:<28} {_number(f.mean_abs)} {_number(f.p99_abs)} {_number(f.max_abs)} "
            f"{_number(f.mean)}"
            for f in self.fields_by_change()[:fields]
        ]
        lines += [
            "",
            f"{'recording':<32} {'compared':>8} {'max flip':>9} {'decision':<15} {'mean |d|':>10}",
        ]
        lines += [
            f"{_cut(r.recording, 32):<32} {r.compared:>8} {_share(r.max_flip_share):>9} "
            f"{r.max_flip_decision or '-':<15} {_number(r.mean_abs)}"
            for r in self.recordings[:recordings]
        ]
        if len(self.recordings) > recordings:
            lines.append(f"... {len(self.recordings) - recordings} more in recordings.parquet")
        return "\n".join(lines)


def _number(value: float) -> str:
    return f"{value:>10.4g}" if not math.isnan(value) else f"{'-':>10}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _arrow_table(rows: list[dict[str, Any]], types: tuple[tuple[str, str], ...]) -> Any:
    import pyarrow as pa

    def arrow_type(name: str) -> Any:
        if name.startswith("list<"):
            return pa.list_(arrow_type(name[len("list<") : -1]))
        return getattr(pa, name)()

    schema = pa.schema([pa.field(name, arrow_type(kind)) for name, kind in types])
    return pa.Table.from_pylist(rows, schema=schema)


def write_comparison(comparison: FleetComparison, out: Path) -> None:
    """Write ``comparison`` into the directory ``out`` (made if missing):
    :data:`COMPARISON_FILES`, each written beside its name and renamed to it whole, the JSON
    document last. :class:`OSError` when a file cannot be written."""
    import pyarrow.parquet as pq

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = comparison.to_record()
    fields_file, recordings_file, document = (out / name for name in COMPARISON_FILES)
    for path, rows, types in (
        (fields_file, record["fields"], _FIELD_TYPES),
        (recordings_file, record["recordings"], _RECORDING_TYPES),
    ):
        table = _arrow_table(rows, types)

        def parquet(target: Path, table: Any = table) -> None:
            pq.write_table(table, target)

        replace_whole(path, parquet)
    text = json.dumps(record, indent=1, allow_nan=False) + "\n"
    replace_whole(document, lambda target: target.write_text(text, encoding="utf-8"))


def read_comparison(directory: Path) -> FleetComparison:
    """The comparison that :func:`write_comparison` wrote into ``directory`` (its JSON
    document); :class:`ValueError`, one line, when there is none or it is not one."""
    document = Path(directory) / COMPARISON_FILES[-1]
    try:
        record = json.loads(document.read_text(encoding="utf-8"))
        return FleetComparison.from_record(record)
    except FileNotFoundError:
        raise ValueError(f"{str(directory)!r} holds no {COMPARISON_FILES[-1]}") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{str(document)!r} is not a fleet comparison: {exc}") from None
