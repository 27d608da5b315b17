"""The report's page: one HTML file that shows the pictures beside the summary's tables."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING

from ._analysis import STATES, Episode, RunData

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["page", "write_pictures"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1120px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { width: 100%; border: 1px solid #eee; }
.note { color: #666; font-size: 0.9em; }
"""


_NUMBER = re.compile(r"^(?:[-\d.]+|—)(?: |$)")
"""A cell that is a number (with its unit or share after it): aligned right."""


_BUDGET_SOURCE = {"messages": ", as the messages carry it", "option": ""}


def _ms(value: float | None) -> str:
    return "—" if value is None or math.isnan(value) else f"{value * 1e3:.1f}"


def _rows(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{escape(cell)}</th>" for cell in header) if header else ""
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{escape(cell)}</td>'
            if _NUMBER.match(cell)
            else f"<td>{escape(cell)}</td>"
            for cell in row
        )
        + "</tr>"
        for row in rows
    )
    return f"<table>{f'<tr>{head}</tr>' if head else ''}{body}</table>"


def _summary(data: RunData) -> str:
    s = data.summary
    rows = [
        ["messages", f"{s.messages}"],
        ["frames (status messages apart)", f"{s.frames}"],
        ["status messages (no frame)", f"{s.status}"],
        ["valid", f"{s.valid} ({100 * s.valid_share:.1f} %)"],
        ["frame ids skipped (dropped)", f"{s.missing_frames}"],
        [f"valid, late: past the budget ({data.budget * 1e3:g} ms"
         f"{_BUDGET_SOURCE[data.budget_source]})", f"{s.late}"],
        ["duration (first to last message)", f"{s.duration:.2f} s"],
        ["first AVAILABLE", "never" if s.first_available is None else f"{s.first_available:.3f} s"],
        ["invalid", f"{s.messages - s.valid}"],
    ]  # fmt: skip
    for state in STATES:
        share = 100 * s.time_in[state] / s.duration if s.duration > 0 else math.nan
        rows.append([f"time {state.value}", f"{s.time_in[state]:.2f} s ({share:.1f} %)"])
    return _rows(rows)


def _latencies(data: RunData) -> str:
    rows = [
        [name, *(f"{found[q]:.1f}" if not math.isnan(found[q]) else "—" for q in found)]
        for name, found in data.summary.percentiles_ms.items()
    ]
    return _rows(rows, ["ms", "p50", "p90", "p99", "max"])


def _invalid(data: RunData) -> str:
    counts = data.summary.invalid_by_kind.most_common()
    if not counts:
        return "<p>No invalid messages.</p>"
    return _rows([[kind, f"{count}"] for kind, count in counts], ["kind", "messages"])


def _episode_row(episode: Episode) -> list[str]:
    states = "/".join(state.value for state in STATES if state in episode.states)
    return [
        f"#{episode.number}",
        episode.cause,
        states,
        f"{episode.detected:.3f}",
        _ms(episode.detection),
        _ms(episode.to_unavailable),
        _ms(episode.recovery),
        _ms(episode.outage) if episode.recovered is not None else "not recovered",
    ]


def _episodes(data: RunData) -> str:
    if not data.episodes:
        return "<p>No fault episodes.</p>"
    header = ["", "cause", "states", "at (s)", "detection ms", "to unavailable ms",
              "recovery ms", "outage ms"]  # fmt: skip
    return _rows([_episode_row(e) for e in data.episodes], header)


def page(
    data: RunData,
    images: Sequence[tuple[str, str]],
    *,
    source: str,
    notes: Sequence[str] = (),
) -> str:
    """The page: a title naming ``source``, ``notes`` (lines left out of the input, other runs in
    it), the summary, each of ``images`` (file name, caption), then the latency percentiles,
    invalid messages by kind and the fault episodes as tables."""
    run = f" — run {data.summary.run_id}" if data.summary.run_id else ""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>DMS run report: {escape(source)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>DMS run report: {escape(source)}{escape(run)}</h1>",
        *(f'<p class="note">{escape(note)}</p>' for note in notes),
        "<h2>Summary</h2>",
        _summary(data),
    ]
    for name, caption in images:
        parts += [
            f"<h2>{escape(caption)}</h2>",
            f'<img src="{escape(name)}" alt="{escape(caption)}">',
        ]
    parts += [
        "<h2>Latency percentiles</h2>",
        _latencies(data),
        '<p class="note">Frame age over the frames published (status messages apart); model '
        "and GPU times over the frames a model ran for.</p>",
        "<h2>Invalid messages by kind</h2>",
        _invalid(data),
        "<h2>Fault episodes</h2>",
        _episodes(data),
        '<p class="note">Detection: the fault\'s first invalid frame (its start of frame) to the '
        "first message away from AVAILABLE. Recovery: the first trustworthy output again to the "
        "message that is AVAILABLE. Outage: the first message away from AVAILABLE to the next "
        "AVAILABLE one. Times are as the messages show them; the start-up is not an episode.</p>",
    ]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_pictures(
    directory: Path,
    figures: Mapping[str, Figure],
    captions: Mapping[str, str],
    html: Callable[[list[tuple[str, str]]], str],
) -> list[Path]:
    """Write ``figures`` (``NAME.png``) and ``index.html`` into ``directory`` (made if missing),
    the page made by ``html`` from each picture's file name and caption: the files written,
    the page last. :class:`OSError` if a file cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, figure in figures.items():
        path = directory / f"{name}.png"
        figure.savefig(path, dpi=100)
        written.append(path)
    index = directory / "index.html"
    index.write_text(html([(path.name, captions[path.stem]) for path in written]), encoding="utf-8")
    return [*written, index]
