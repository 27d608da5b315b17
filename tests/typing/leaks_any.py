# mypy: disallow-any-expr
"""A program that does reach an ``Any`` (a message's JSON record): the strict check of
``tests/test_dms_embedding.py`` must find it, or it finds nothing anywhere."""

from __future__ import annotations

from pipelines.dms import DriverStateV2


def frame_of(message: DriverStateV2) -> object:
    return message.to_record()["frameId"]
