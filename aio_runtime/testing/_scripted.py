"""Scripted hardware: values, signals and firmware that complete late, never, or only partly.

Scripts are functions of the loop clock, so under :func:`~aio_runtime.testing.virtual_time` they
are exact: a value scripted to change at 2.5 s changes at 2.5 s.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .._core._clock import now
from .._core._mailbox import MailboxLayout, MemoryRegisters
from .._core._signals import TimelineSignal
from .._core._waits import pause

__all__ = ["Reply", "ScriptedFirmware", "ScriptedProbe", "play_script"]


class ScriptedProbe:
    """A probe whose value follows a script: ``initial``, then each ``(seconds, value)`` step.

    Seconds count from the first read. Call it (a plain read) or await :meth:`read` (an async read
    that takes ``latency`` seconds, like a register read over a link). ``reads`` counts the reads.

    Shapes: :meth:`late` (reaches the value after a delay), :meth:`never` (stays put),
    :meth:`partial` (advances in steps that stop short of the target).
    """

    def __init__(
        self,
        initial: int,
        steps: Iterable[tuple[float, int]] = (),
        *,
        latency: float = 0.0,
    ) -> None:
        ordered = sorted(steps)
        self._times = [t for t, _ in ordered]
        self._values = [v for _, v in ordered]
        self.initial = initial
        self.latency = latency
        self.reads = 0
        self._start: float | None = None
        self._instants: list[float] = []

    @classmethod
    def late(
        cls, value: int, after: float, *, initial: int = 0, latency: float = 0.0
    ) -> ScriptedProbe:
        return cls(initial, [(after, value)], latency=latency)

    @classmethod
    def never(cls, initial: int = 0, *, latency: float = 0.0) -> ScriptedProbe:
        return cls(initial, latency=latency)

    @classmethod
    def partial(
        cls, values: Iterable[int], every: float, *, initial: int = 0, latency: float = 0.0
    ) -> ScriptedProbe:
        """``values`` one after another, one every ``every`` seconds, then no further."""
        return cls(initial, [(every * (i + 1), v) for i, v in enumerate(values)], latency=latency)

    def value_at(self, elapsed: float) -> int:
        index = bisect.bisect_right(self._times, elapsed)
        return self.initial if index == 0 else self._values[index - 1]

    def __call__(self) -> int:
        t = now()
        if self._start is None:
            self._start = t
            # Each step's instant, summed as a timeout's deadline is (start + seconds): a step
            # due at a wait's deadline has come when the clock reaches it, whereas the seconds
            # since the start, subtracted back, may fall short of it by a rounding error.
            self._instants = [t + seconds for seconds in self._times]
        self.reads += 1
        index = bisect.bisect_right(self._instants, t)
        return self.initial if index == 0 else self._values[index - 1]

    async def read(self) -> int:
        if self.latency:
            await pause(self.latency)
        return self()


async def play_script(signal: TimelineSignal, steps: Iterable[tuple[float, int]]) -> None:
    """Store each ``(seconds, value)`` into ``signal`` at that time after the call, as a device would.

    Run it in a task group beside the code under test.
    """
    start = now()
    for at, value in sorted(steps):
        delay = start + at - now()
        if delay > 0:
            await pause(delay)
        signal.set(value)


@dataclass(frozen=True)
class Reply:
    """How scripted firmware answers a message: ``code`` after ``after`` seconds (never if ``math.inf``)."""

    code: int = 1
    after: float = 0.0
    argument: int | None = None


class ScriptedFirmware(MemoryRegisters):
    """Registers with firmware behind a mailbox: a write to the message register is a request.

    ``replies`` maps message ids to a :class:`Reply`; other messages get ``default``. The reply's
    code appears in the response register once its delay has passed (and, if given, its argument in
    the argument register). Like real firmware it handles one message at a time: a message written
    while the previous one is still unanswered is ignored (recorded in ``ignored``), so a host that
    does not wait for an outstanding answer reads the old answer as the new one. ``requests`` records
    ``(time, message, argument)`` of every message handled, in order.
    """

    def __init__(
        self,
        layout: MailboxLayout,
        *,
        words: int = 128,
        replies: Mapping[int, Reply] | None = None,
        default: Reply = Reply(),
    ) -> None:
        super().__init__(words)
        self.layout = layout
        self.replies = dict(replies or {})
        self.default = default
        self.requests: list[tuple[float, int, int]] = []
        self.ignored: list[tuple[float, int, int]] = []
        self._due: tuple[float, Reply] | None = None

    @staticmethod
    def never() -> Reply:
        return Reply(after=math.inf)

    async def write(self, index: int, value: int) -> None:
        self._answer_if_due()
        await super().write(index, value)
        if index == self.layout.message:
            argument = int(self.words[self.layout.argument])
            t = now()
            if self._due is not None:
                self.ignored.append((t, value, argument))
                return
            self.requests.append((t, value, argument))
            reply = self.replies.get(value, self.default)
            self._due = (t + reply.after, reply)

    def _answer_if_due(self) -> None:
        if self._due is not None and now() >= self._due[0]:
            reply = self._due[1]
            self._due = None
            self.words[self.layout.response] = reply.code
            if reply.argument is not None:
                self.words[self.layout.argument] = reply.argument

    async def read(self, index: int) -> int:
        self._answer_if_due()
        return await super().read(index)
