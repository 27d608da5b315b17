"""The fault plan: a script of what goes wrong in the simulator, and when.

Each place in the simulator where something can go wrong is a *check point* for one :class:`Fault`
(every bulk transfer checks ``USB_TIMEOUT`` and ``SHORT_TRANSFER``, every SMU message checks
``SMU_NO_RESPONSE`` and ``SMU_ERROR_CODE``, ...). At each check point the simulator asks the plan
``plan.check(Fault.X)``: the plan counts the occurrence and answers with the rule that fires, if any.

A rule fires either on occurrences — the ``at``-th occurrence and the ``count - 1`` after it
(``count=math.inf``: until cleared) — or in a time window — every occurrence between ``start`` and
``end`` seconds. Both count from when the rule was added to the plan (occurrences and loop-clock
time, so exact under virtual time): ``at=1`` added mid-run means "the next one". Rules can be added
and cleared while the simulation runs; a cleared fault stops firing at its next check point, which
is how a test lets a device "recover". ``fired`` records every firing, for assertions.

Checking a fault that has no rule costs a dictionary lookup and no clock read: check points sit on
every simulated transfer.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from aio_runtime import loop_clock

__all__ = ["Fault", "FaultPlan", "FaultRule", "Firing"]


class Fault(enum.Enum):
    """Everything the simulator can be scripted to get wrong."""

    # Members are singletons: hash by identity (C-level), not by name (check points are hot).
    __hash__ = object.__hash__

    USB_TIMEOUT = "usb-timeout"
    """A transfer is never completed by the device; only the host's timeout ends it."""
    SHORT_TRANSFER = "short-transfer"
    """A transfer completes with fewer bytes than asked (param ``length``, default half)."""
    DISCONNECT = "disconnect"
    """The device is gone (no device) while the rule is active; it reappears when cleared."""
    TLP_RETRY_STORM = "tlp-retry-storm"
    """The bridge answers PCIe requests with its "retry" status."""
    SENTINEL_NEVER_CONSUMED = "sentinel-never-consumed"
    """The copy engine never sees a copy-in chunk's sentinel: the chunk fence stalls."""
    USB_COMPLETION_LOST = "usb-completion-lost"
    """The GPU consumed a chunk, but the bulk OUT's completion never reaches the host."""
    CORRUPT_SENTINEL = "corrupt-sentinel"
    """A chunk's sentinel lands corrupted in SRAM (the copy engine waits for the right one)."""
    COPYOUT_RELEASE_NEVER = "copyout-release-never"
    """The GPU never writes the completion page: an armed SRAM read is never released."""
    KERNEL_HANG = "kernel-hang"
    """A compute kernel never finishes: the timeline is not signalled."""
    COPY_WATCHDOG = "copy-watchdog"
    """The copy engine's watchdog fires: the engine stops and raises an interrupt."""
    SMU_NO_RESPONSE = "smu-no-response"
    """The SMU never answers a message."""
    SMU_ERROR_CODE = "smu-error-code"
    """The SMU answers with an error code (param ``code``, default 0xFF)."""
    PSP_RING_TIMEOUT = "psp-ring-timeout"
    """The PSP never writes a ring submission's fence."""
    PSP_ERROR_STATUS = "psp-error-status"
    """The PSP completes a ring submission with a non-zero status (param ``status``)."""
    IH_FAULT = "ih-fault"
    """The interrupt ring reports a fault: the device enters its error state."""


@dataclass
class FaultRule:
    """When ``fault`` fires: on occurrences ``at`` .. ``at + count - 1`` (1-based), or on every
    occurrence inside ``window`` = (start, end) seconds — both counted from when the rule was added
    to a plan. ``params`` tune the fault (an error code, a short length)."""

    fault: Fault
    at: int | None = None
    count: float = 1
    window: tuple[float, float] | None = None
    params: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.at is None) == (self.window is None):
            raise ValueError("a fault rule needs exactly one of 'at' (occurrence) or 'window'")
        if self.at is not None and self.at < 1:
            raise ValueError(f"'at' counts occurrences from 1, got {self.at}")
        if not self.count >= 1:
            raise ValueError(f"'count' must be >= 1 (or math.inf), got {self.count}")
        if self.window is not None:
            start, end = self.window
            if not (0 <= start < end):
                raise ValueError(
                    f"'window' must be (start, end) with 0 <= start < end, got {self.window}"
                )
        self.params = MappingProxyType(dict(self.params))

    def matches(self, occurrence: int, elapsed: float) -> bool:
        """Whether the rule fires at the ``occurrence``-th check (1-based) and ``elapsed``
        seconds, both counted from when it was added to a plan."""
        if self.at is not None:
            return self.at <= occurrence < self.at + self.count
        assert self.window is not None
        return self.window[0] <= elapsed < self.window[1]


@dataclass(frozen=True, slots=True)
class _Added:
    """A rule as a plan holds it: with the occurrence count and the time it was added at, which
    its occurrences and its window count from (the rule itself is left as it was)."""

    rule: FaultRule
    occurrences: int
    time: float

    def fires(self, occurrence: int, time: float) -> bool:
        return self.rule.matches(occurrence - self.occurrences, time - self.time)


@dataclass(frozen=True)
class Firing:
    fault: Fault
    occurrence: int
    """The check point's occurrence count since the plan started."""
    elapsed: float
    """Seconds since the plan started."""
    rule: FaultRule


class FaultPlan:
    """The faults a simulation will suffer. Create it on the event loop (time counts from then)."""

    def __init__(self, rules: Iterable[FaultRule] = ()) -> None:
        self._clock = loop_clock()
        self.started = self._clock()
        self._rules: dict[Fault, list[_Added]] = {}
        self._occurrences: dict[Fault, int] = {}
        self.fired: list[Firing] = []
        for rule in rules:
            self.add(rule)

    def add(self, rule: FaultRule) -> FaultRule:
        """Add a rule; its occurrences and its window count from now."""
        added = _Added(rule, self._occurrences.get(rule.fault, 0), self._clock())
        self._rules.setdefault(rule.fault, []).append(added)
        return rule

    def clear(self, fault: Fault | None = None) -> None:
        """Remove every rule (of ``fault``, if given); the fault stops at its next check point."""
        if fault is None:
            self._rules.clear()
        else:
            self._rules.pop(fault, None)

    def occurrences(self, fault: Fault) -> int:
        """How many times the simulator has reached ``fault``'s check point."""
        return self._occurrences.get(fault, 0)

    def check(self, fault: Fault) -> FaultRule | None:
        """Count one occurrence of ``fault``'s check point; return the rule that fires, if any."""
        occurrence = self._occurrences.get(fault, 0) + 1
        self._occurrences[fault] = occurrence
        rules = self._rules.get(fault)
        if not rules:
            return None
        t = self._clock()
        for added in rules:
            if added.fires(occurrence, t):
                self.fired.append(Firing(fault, occurrence, t - self.started, added.rule))
                return added.rule
        return None

    def __repr__(self) -> str:
        count = sum(len(rules) for rules in self._rules.values())
        return f"FaultPlan({count} rules, {len(self.fired)} fired)"
