"""The same code with one deliberate type error, which ``mypy --strict`` must report: were the
packages' types missing from the wheel, everything from the service would be ``Any`` and the
mistake would pass unseen."""

from __future__ import annotations

from pipelines.dms import Summary


def frames_received(summary: Summary) -> str:
    return summary.frames.received  # the mistake: an int, returned as a str
