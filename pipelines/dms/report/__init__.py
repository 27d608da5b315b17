"""Reports on a run: what its published messages say, as pictures and a page.

This package turns messages into the data of each picture (pure, no drawing):
:func:`read_messages` / :func:`parse_lines` read JSON lines into :class:`Message` items
(``Message.from_record`` takes any store's records), :func:`split_runs` cuts a file into runs,
:func:`analyse` gives one run's :class:`RunData` — availability bands, latency series, invalid
frames by kind, fault episodes with their detection and recovery times, a summary — from the
parts it is made of (:func:`publication_times`, :func:`starts_of_frame`, :func:`bands_of`,
:func:`episodes_of`).
:mod:`pipelines.dms.report.figures` draws it (matplotlib), and
:mod:`pipelines.cli.report` is ``aio-dms report``, which writes the pictures and an
``index.html``.
"""

from __future__ import annotations

from ._analysis import (
    STATES,
    Band,
    Episode,
    LatencySeries,
    RunData,
    RunSummary,
    analyse,
    bands_of,
    cause_of,
    episodes_of,
    frame_interval,
    publication_times,
    starts_of_frame,
)
from ._reading import Message, Reading, ReportInputError, parse_lines, read_messages, split_runs

__all__ = [
    "STATES",
    "Band",
    "Episode",
    "LatencySeries",
    "Message",
    "Reading",
    "ReportInputError",
    "RunData",
    "RunSummary",
    "analyse",
    "bands_of",
    "cause_of",
    "episodes_of",
    "frame_interval",
    "parse_lines",
    "publication_times",
    "read_messages",
    "split_runs",
    "starts_of_frame",
]
