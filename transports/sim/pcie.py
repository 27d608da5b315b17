"""The simulated bridge's PCIe port: the host's PCIe requests, carried out on what sits behind the
bridge (a :class:`PcieTarget`: the simulated GPU), and the completion register they leave behind.

A non-posted request leaves its :class:`~transports.protocol.bridge.PcieCompletion` to be read: the
target's data, "unsupported request" for an address nothing claims or while the link is down, or
the bridge's own "busy, retry" under a ``TLP_RETRY_STORM`` fault. A posted write to an address
nothing claims, or over a link that is down, is dropped; a stream's read nobody claims reads all
ones (a master abort).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..protocol.bridge import (
    COMPLETION_SIZE,
    CompletionStatus,
    Tlp,
    TlpType,
    enabled_lanes,
    pack_completion,
    parse_config_address,
)
from .faults import Fault, FaultPlan

__all__ = ["PciePort", "PcieTarget", "Refused"]


class PcieTarget(Protocol):
    """What sits behind the bridge (the simulated GPU). Raise ``LookupError`` for an address
    nothing claims (the bridge answers "unsupported request")."""

    def config_read(self, bus: int, device: int, function: int, register: int) -> int: ...

    def config_write(
        self, bus: int, device: int, function: int, register: int, value: int, byte_enables: int
    ) -> None: ...

    def memory_read(self, address: int, size: int) -> bytes: ...

    def memory_write(self, address: int, data: bytes) -> None: ...


class Refused(Exception):
    """A request the bridge refuses: its URB ends with a stall."""


class PciePort:
    """Carries out single TLPs on ``target`` while ``link_up()``; :attr:`completion` is the
    packed completion of the last non-posted one."""

    def __init__(self, target: PcieTarget, plan: FaultPlan, link_up: Callable[[], bool]) -> None:
        self.target = target
        self.plan = plan
        self.link_up = link_up
        self.completion = bytes(COMPLETION_SIZE)
        self._handlers: dict[TlpType, Callable[[Tlp], None]] = {
            TlpType.MWR32: self._memory_write,
            TlpType.MWR64: self._memory_write,
            TlpType.MRD32: self._memory_read,
            TlpType.MRD64: self._memory_read,
            TlpType.CFG_READ0: self._config_read,
            TlpType.CFG_READ1: self._config_read,
            TlpType.CFG_WRITE0: self._config_write,
            TlpType.CFG_WRITE1: self._config_write,
        }

    def request(self, tlp: Tlp) -> None:
        """One TLP; :class:`Refused` for a type the bridge does not know."""
        kind = tlp.kind
        posted = kind is not None and kind.posted
        if not posted and self.plan.check(Fault.TLP_RETRY_STORM):
            self._complete(0, bridge_status=1)
            return
        if not self.link_up():  # a posted write to a link that is down is simply lost
            if not posted:
                self._complete(0, CompletionStatus.UNSUPPORTED_REQUEST)
            return
        if kind is None:
            raise Refused(f"TLP fmt/type 0x{tlp.fmt_type:x} is not supported")
        try:
            self._handlers[kind](tlp)
        except LookupError:
            self._complete(0, CompletionStatus.UNSUPPORTED_REQUEST)

    def write(self, address: int, data: bytes) -> None:
        """A host memory write goes to the target; one nobody claims is dropped (it is posted)."""
        try:
            self.target.memory_write(address, data)
        except LookupError:
            pass

    def read(self, address: int, size: int) -> bytes:
        """A host memory read; nobody claiming it reads all ones (a master abort)."""
        try:
            return self.target.memory_read(address, size)
        except LookupError:
            return b"\xff" * size

    def _memory_write(self, tlp: Tlp) -> None:
        first, size = enabled_lanes(tlp.byte_enables)
        self.write(tlp.address + first, tlp.word.to_bytes(4, "little")[first : first + size])

    def _memory_read(self, tlp: Tlp) -> None:
        first, size = enabled_lanes(tlp.byte_enables)
        read = self.target.memory_read(tlp.address + first, size)
        self._complete(int.from_bytes(read, "little") << (8 * first))

    @staticmethod
    def _config_target(tlp: Tlp) -> tuple[int, int, int, int]:
        bus, device, function, register = parse_config_address(tlp.address)
        if (tlp.fmt_type & 1) != (bus > 0):  # type 0 reaches bus 0 only, type 1 the rest
            raise LookupError(f"config type {tlp.fmt_type & 1} for bus {bus}")
        return bus, device, function, register

    def _config_read(self, tlp: Tlp) -> None:
        self._complete(self.target.config_read(*self._config_target(tlp)))

    def _config_write(self, tlp: Tlp) -> None:
        self.target.config_write(*self._config_target(tlp), tlp.word, tlp.byte_enables)
        self._complete(0)

    def _complete(
        self, data: int, status: CompletionStatus = CompletionStatus.SUCCESS, bridge_status: int = 0
    ) -> None:
        self.completion = pack_completion(data, status, bridge_status)
