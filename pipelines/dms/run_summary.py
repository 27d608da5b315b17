"""The summary that ``aio-dms run`` and ``aio-dms replay`` print as they end.

Only the standard library at run time: the entry point imports this module before the service's
own (much longer) imports, so that a signal which interrupts those is still reported with this
summary; a module whose import a signal interrupted cannot safely be imported again.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .service import Summary
    from .sinks_policy import SinkStats

__all__ = ["format_summary", "summary_before_start"]


def format_summary(summary: Summary, *, stopped: str | None = None) -> str:
    """``summary`` as the commands print it: frames received, published (the invalid ones by
    reason), dropped (by stage), frame ages, each sink's counts, the availability's changes;
    ``stopped``: what stopped the service before it ended by itself."""
    frames = summary.frames
    ages = (summary.latency_ms(50), summary.latency_ms(99), summary.latency_ms(100))
    return _text(
        (frames.received, frames.valid, frames.invalid, frames.dropped),
        ages,
        summary.sinks,
        summary.transitions,
        stopped,
    )


def summary_before_start() -> str:
    """The summary of a command stopped by a signal before its service had started: nothing
    received, nothing published."""
    nothing = (0, 0, Counter[str](), Counter[str]())
    return _text(nothing, (math.nan,) * 3, (), [], "signal, before the service had started")


def _text(
    frames: tuple[int, int, Counter[str], Counter[str]],
    ages: tuple[float, float, float],
    sinks: Iterable[SinkStats],
    transitions: list[tuple[float, str]],
    stopped: str | None,
) -> str:
    received, valid, invalid, dropped = frames
    lines = [
        "",
        "summary" + (f" (stopped: {stopped})" if stopped else ""),
        f"  frames received      {received}",
        f"  published valid      {valid}",
        f"  published invalid    {sum(invalid.values())}",
    ]
    for reason, count in invalid.most_common():
        lines.append(f"    {count:5d}  {reason[:100]}")
    lines.append(f"  dropped              {sum(dropped.values())}")
    for stage, count in sorted(dropped.items()):
        lines.append(f"    {count:5d}  at {stage}")
    p50, p99, most = ages
    lines.append(f"  frame age ms         p50 {p50:.1f}  p99 {p99:.1f}  max {most:.1f}")
    for sink in sinks:
        lines.append(
            f"  sink {sink.name:<14} published {sink.published}, delivered {sink.delivered}, "
            f"dropped {sink.dropped}" + (f"; failed: {sink.failed}" if sink.failed else "")
        )
    lines.append("  availability")
    start = transitions[0][0] if transitions else 0.0
    for when, state in transitions:
        lines.append(f"    {when - start:8.3f} s  {state[:110]}")
    return "\n".join(lines)
