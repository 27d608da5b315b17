"""What a run's messages say, as the data of each picture: availability bands, latency series,
invalid frames by kind, fault episodes, and the summary. Pure: no drawing, no files.

Times are seconds on the run's own axis, 0 at the first message's publication. A message's
publication time is its start of frame plus its frame age; a status message (no frame) is
published the frame age after the newest frame before it; a status message before any frame is
placed at the next message that can be placed (the first frame). Publication times are taken
as never going back (each at least the one before), as the messages were published in order.

A **fault episode** is a stretch of messages away from AVAILABLE (DEGRADED or UNAVAILABLE), from
the first such message to the next AVAILABLE one; the stretch at the start of the run, before
the service was first AVAILABLE, is the start-up, not a fault. The messages say when each frame
started and when it was published, not when a fault was injected, so for each episode:

- **onset**: the start of frame of the fault's first invalid frame (the first invalid message
  after the last valid one before the episode); for a status message, when the frame that did
  not come was due (the newest frame's start plus one frame interval, the median spacing of the
  run's frames);
- **detection** = the publication of the episode's first message (the first to say DEGRADED or
  UNAVAILABLE) minus the onset; **to unavailable**, the same to the first UNAVAILABLE message (None when
  the episode stayed DEGRADED);
- **fault end**: the start of frame of the first trustworthy output again — the first of the
  episode's closing valid messages (good outputs, waiting out the hysteresis; an ``overloaded``
  one is part of the fault, and so are the older records' invalid ``recovering`` ones), or the
  AVAILABLE message itself when there are none;
- **recovery** = the publication of the AVAILABLE message that ends the episode minus the fault end
  (None when the run ended first); **outage** = that publication minus the episode's first.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from aio_runtime import Availability, Reason

from ._reading import Message

__all__ = [
    "STATES",
    "Band",
    "Episode",
    "LatencySeries",
    "RunData",
    "RunSummary",
    "analyse",
    "bands_of",
    "cause_of",
    "episodes_of",
    "frame_interval",
    "publication_times",
    "starts_of_frame",
]

STATES = (Availability.AVAILABLE, Availability.DEGRADED, Availability.UNAVAILABLE)
"""The states, best first."""
_AVAILABLE = Availability.AVAILABLE
RECOVERING = "recovering"
"""The kind of a good output published, invalid, while the service waited out its hysteresis
(older records: such an output is valid now, its reason the availability's)."""
OVERLOADED = "overloaded"
"""The kind of a valid output's reason while the service cannot keep up with its camera."""
_RECOVERING_DETAIL = re.compile(r"^(?:available|degraded|unavailable) \((?P<reason>.*)\)$")


@dataclass(frozen=True)
class Band:
    """One availability interval: consecutive messages in the same state."""

    availability: Availability
    start: float
    end: float
    """The publication of the next interval's first message (the run's last message for the
    last interval)."""
    messages: int
    kinds: Counter[str]
    """The reasons' kinds of its messages, counted."""
    cause: str
    """What the interval is about ("" for AVAILABLE): see :func:`cause_of`."""


@dataclass(frozen=True)
class Episode:
    """A stretch away from AVAILABLE (see the module's docstring for each time's definition)."""

    number: int
    """From 1, in the run's order; the start-up is not counted."""
    cause: str
    states: frozenset[Availability]
    onset: float
    detected: float
    unavailable: float | None
    fault_end: float | None
    recovered: float | None

    @property
    def detection(self) -> float:
        return self.detected - self.onset

    @property
    def to_unavailable(self) -> float | None:
        return None if self.unavailable is None else self.unavailable - self.onset

    @property
    def recovery(self) -> float | None:
        if self.recovered is None or self.fault_end is None:
            return None
        return self.recovered - self.fault_end

    @property
    def outage(self) -> float | None:
        return None if self.recovered is None else self.recovered - self.detected


@dataclass(frozen=True)
class LatencySeries:
    """Per frame message (status messages apart), in milliseconds; NaN where no model ran."""

    time: list[float]
    frame_age_ms: list[float]
    model_ms: list[float]
    gpu_ms: list[float]
    status_time: list[float]
    status_age_ms: list[float]
    """Status messages: the newest frame's age as each was published."""


@dataclass(frozen=True)
class RunSummary:
    messages: int
    frames: int
    """Frame messages (status messages apart)."""
    status: int
    valid: int
    duration: float
    """First to last publication, seconds."""
    time_in: dict[Availability, float]
    """Seconds in each state (the bands' lengths added up)."""
    invalid_by_kind: Counter[str]
    """Invalid messages by their reason's kind, status messages included."""
    missing_frames: int
    """Frame ids skipped between published frames (dropped, or never published)."""
    late: int
    """Valid frame messages published after their deadline (see :func:`_late`)."""
    percentiles_ms: dict[str, dict[str, float]]
    """``{"frame age"|"model"|"GPU": {"p50"|"p90"|"p99"|"max": ms}}``; model and GPU times over
    the frames a model ran for (NaN where there are none)."""
    first_available: float | None
    """When the service was first AVAILABLE (None: never)."""
    run_id: str | None

    @property
    def valid_share(self) -> float:
        return self.valid / self.messages if self.messages else math.nan


@dataclass(frozen=True)
class RunData:
    """Everything a report draws of one run."""

    budget: float
    budget_source: str
    """``"messages"`` when the messages carried it, else ``"option"``."""
    bands: list[Band]
    series: LatencySeries
    episodes: list[Episode]
    summary: RunSummary
    frame_interval: float
    """The median spacing of the run's frames (seconds; 0 with fewer than two frames)."""
    startup: Episode | None = field(default=None)
    """The stretch before the service was first AVAILABLE, as an episode (number 0)."""


def cause_of(message: Message) -> str:
    """What a message says the service's state is about: its availability's reason's kind, else
    its own reason's (older records: their invalid messages carried the availability's); for an
    older ``recovering`` message, the kind of the reason it is recovering from
    (``"recovering: unavailable (camera: ...)"`` → ``camera``)."""
    if message.availability_kind:
        return message.availability_kind
    if message.kind == RECOVERING:
        match = _RECOVERING_DETAIL.match(Reason.of(message.reason).detail)
        if match is not None:
            return Reason.of(match["reason"]).kind
    return message.kind


def _cause(messages: Sequence[Message]) -> str:
    """What a stretch of messages is about: the cause of its first message that names one (a
    ``model unavailable`` message only says the model cannot run yet)."""
    for message in messages:
        cause = cause_of(message)
        if cause and cause != "model unavailable":
            return cause
    return cause_of(messages[0]) if messages else ""


def _origin(messages: Sequence[Message]) -> float:
    """The first frame message's publication, absolute seconds: the run's time 0 (status
    messages before it are placed there too). 0 when there is no frame."""
    first = next((m for m in messages if not m.is_status), None)
    return 0.0 if first is None else first.sof_ns / 1e9 + first.frame_age


def publication_times(messages: Sequence[Message]) -> list[float]:
    """Each message's publication on the run's axis, as the module's docstring says."""
    origin = _origin(messages)
    times: list[float] = []
    newest: int | None = None
    for message in messages:
        if not message.is_status:
            newest = message.sof_ns
        at = origin if newest is None else newest / 1e9 + message.frame_age
        times.append(max(at - origin, times[-1]) if times else at - origin)
    return times


def frame_interval(messages: Sequence[Message]) -> float:
    """The median spacing of the frames' starts, per frame id (seconds; 0 with fewer than two
    frames)."""
    frames = [m for m in messages if not m.is_status]
    steps = [
        (b.sof_ns - a.sof_ns) / 1e9 / (b.frame_id - a.frame_id)
        for a, b in itertools.pairwise(frames)
        if b.frame_id > a.frame_id and b.sof_ns > a.sof_ns
    ]
    return float(np.median(steps)) if steps else 0.0


def starts_of_frame(messages: Sequence[Message], interval: float) -> list[float]:
    """Each message's start of frame on the run's axis; a status message's is when the frame
    that did not come was due: the newest frame's start plus ``interval`` (before any frame:
    the next frame's start less ``interval``)."""
    origin = _origin(messages)
    starts: list[float | None] = [
        None if m.is_status else m.sof_ns / 1e9 - origin for m in messages
    ]
    newest: float | None = None
    for at, start in enumerate(starts):
        if start is not None:
            newest = start
        elif newest is not None:
            starts[at] = newest + interval
    following = next((s for s in starts if s is not None), interval)
    return [following - interval if s is None else s for s in starts]


def bands_of(messages: Sequence[Message], times: Sequence[float]) -> list[Band]:
    """One band per interval of consecutive messages in the same state."""
    bands: list[Band] = []
    begin = 0
    for at in range(1, len(messages) + 1):
        if at < len(messages) and messages[at].availability is messages[begin].availability:
            continue
        chunk = messages[begin:at]
        state = chunk[0].availability
        bands.append(
            Band(
                availability=state,
                start=times[begin],
                end=times[at] if at < len(messages) else times[-1],
                messages=len(chunk),
                kinds=Counter(m.kind for m in chunk if m.kind),
                cause="" if state is Availability.AVAILABLE else _cause(chunk),
            )
        )
        begin = at
    return bands


def episodes_of(
    messages: Sequence[Message], times: Sequence[float], starts: Sequence[float]
) -> tuple[Episode | None, list[Episode]]:
    """The start-up (None if the run began AVAILABLE) and the fault episodes, in order."""
    startup: Episode | None = None
    episodes: list[Episode] = []
    count = len(messages)
    at = 0
    while at < count:
        if messages[at].availability is Availability.AVAILABLE:
            at += 1
            continue
        end = at
        while end < count and messages[end].availability is not Availability.AVAILABLE:
            end += 1
        first_invalid = at
        while first_invalid > 0 and not messages[first_invalid - 1].valid:
            first_invalid -= 1  # invalid while still AVAILABLE: the fault had begun
        closing = next((k + 1 for k in range(end - 1, at - 1, -1) if not _closing(messages[k])), at)
        unavailable = [
            times[i] for i in range(at, end) if messages[i].availability is Availability.UNAVAILABLE
        ]
        stretch = messages[at:end]
        episode = Episode(
            number=0 if at == 0 else len(episodes) + 1,
            cause=_cause(stretch),
            states=frozenset(m.availability for m in stretch),
            onset=starts[first_invalid],
            detected=times[at],
            unavailable=unavailable[0] if unavailable else None,
            fault_end=starts[closing] if closing < count else None,
            recovered=times[end] if end < count else None,
        )
        if at == 0:
            startup = episode
        else:
            episodes.append(episode)
        at = end
    return startup, episodes


def _closing(message: Message) -> bool:
    """A good output waiting out the hysteresis at the end of an episode."""
    return message.kind == RECOVERING or (message.valid and cause_of(message) != OVERLOADED)


def _late(message: Message, budget: float) -> bool:
    """A valid frame published after its deadline: as the message says, or (older records)
    past the budget."""
    if message.late is not None:
        return message.late
    return message.valid and message.frame_age > budget


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return dict.fromkeys(("p50", "p90", "p99", "max"), math.nan)
    found = np.percentile(values, [50, 90, 99, 100])
    return dict(zip(("p50", "p90", "p99", "max"), (float(v) for v in found), strict=True))


def analyse(messages: Sequence[Message], *, budget: float) -> RunData:
    """The data of every picture of one run's ``messages`` (in publication order, at least one).
    ``budget`` (seconds) is the frame budget, unless the messages carry their own."""
    if not messages:
        raise ValueError("a report needs at least one message")
    carried = next((m.budget for m in messages if m.budget is not None), None)
    times = publication_times(messages)
    interval = frame_interval(messages)
    bands = bands_of(messages, times)
    startup, episodes = episodes_of(messages, times, starts_of_frame(messages, interval))
    frames = [(m, t) for m, t in zip(messages, times, strict=True) if not m.is_status]
    status = [(m, t) for m, t in zip(messages, times, strict=True) if m.is_status]
    ms = [m.frame_age * 1e3 for m, _ in frames]
    series = LatencySeries(
        time=[t for _, t in frames],
        frame_age_ms=ms,
        model_ms=[m.model_time * 1e3 if m.model_time > 0 else math.nan for m, _ in frames],
        gpu_ms=[m.gpu_time * 1e3 if m.gpu_time > 0 else math.nan for m, _ in frames],
        status_time=[t for _, t in status],
        status_age_ms=[m.frame_age * 1e3 for m, _ in status],
    )
    ids = [m.frame_id for m, _ in frames]
    chosen = carried if carried is not None else budget
    time_in = dict.fromkeys(STATES, 0.0)
    for band in bands:
        time_in[band.availability] += band.end - band.start
    summary = RunSummary(
        messages=len(messages),
        frames=len(frames),
        status=len(status),
        valid=sum(m.valid for m in messages),
        duration=times[-1] - times[0],
        time_in=time_in,
        invalid_by_kind=Counter(m.kind or "(no reason)" for m in messages if not m.valid),
        missing_frames=sum(max(0, b - a - 1) for a, b in itertools.pairwise(ids)),
        late=sum(_late(m, chosen) for m, _ in frames),
        percentiles_ms={
            "frame age": _percentiles(ms),
            "model": _percentiles([v for v in series.model_ms if not math.isnan(v)]),
            "GPU": _percentiles([v for v in series.gpu_ms if not math.isnan(v)]),
        },
        first_available=next(
            (t for m, t in zip(messages, times, strict=True) if m.availability is _AVAILABLE), None
        ),
        run_id=messages[0].run_id,
    )
    return RunData(
        budget=chosen,
        budget_source="messages" if carried is not None else "option",
        bands=bands,
        series=series,
        episodes=episodes,
        summary=summary,
        frame_interval=interval,
        startup=startup,
    )
