"""Test helpers for code built on the runtime — public API, like ``structlog.testing``.

* :func:`virtual_time` — a virtual clock for the running loop (asyncio or trio), so hardware
  timeouts of many seconds are tested in milliseconds, deterministically; with
  ``hold=threads_busy()`` (asyncio), work the loop awaits on threads takes no virtual time (the
  DMS service runs under ``virtual_time(autojump_threshold=0.005, hold=threads_busy())``).
* :class:`ScriptedProbe`, :func:`play_script`, :class:`ScriptedFirmware`, :class:`Reply` —
  hardware that completes late, never, or partly, on a script.
* :class:`TransitionRecorder` — every availability transition, in order.
* :func:`capture_logs` — structlog events as dicts, context included.

The pytest plugin (registered as ``aio_runtime``) adds the fixtures ``ledger`` (a fresh resource
ledger, asserted empty at teardown) and ``captured_logs``, and warns about each ``anyio`` test that
pytest-asyncio runs instead (``asyncio_mode = auto``: on asyncio, whatever its backend).
"""

from ._recorder import TransitionRecorder, capture_logs
from ._scripted import Reply, ScriptedFirmware, ScriptedProbe, play_script
from ._virtual_time import VirtualClock, threads_busy, virtual_time

__all__ = [
    "Reply",
    "ScriptedFirmware",
    "ScriptedProbe",
    "TransitionRecorder",
    "VirtualClock",
    "capture_logs",
    "play_script",
    "threads_busy",
    "virtual_time",
]
