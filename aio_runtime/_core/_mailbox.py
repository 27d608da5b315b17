"""Register polls and firmware mailboxes (the SMU/PSP request/response shape).

A mailbox is three registers: the host clears the response register, writes the argument, writes
the message id, then waits for firmware to put a response code in the response register. Sends
are serialised per mailbox (the registers are shared state). A response that is not success raises
:class:`~aio_runtime.FirmwareError` as soon as it is read — the firmware has answered, so
there is nothing left to wait for — and no response within the timeout raises
:class:`~aio_runtime.FirmwareTimeout`.

Registers are reached through a :class:`RegisterFile`: async reads and writes, because over a
USB-PCIe bridge every register access is itself a transfer. :class:`MemoryRegisters` backs one with
a plain array (simulators, tests, memory-mapped BARs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Protocol, Required, TypedDict, Unpack, overload

import anyio
import numpy as np

from ._bounds import BoundArgs, SharedBound, WaitBound
from ._clock import validate_timeout
from ._errors import FirmwareError, FirmwareTimeout, HardwareTimeout, Layer
from ._policy import DEFAULT_POLICY, PollPolicy
from ._waits import probe_until, wait_until

__all__ = ["Mailbox", "MailboxLayout", "MemoryRegisters", "RegisterFile", "wait_register"]

_MASK32 = 0xFFFFFFFF


class RegisterFile(Protocol):
    """32-bit registers addressed by index."""

    async def read(self, index: int) -> int: ...

    async def write(self, index: int, value: int) -> None: ...


class MemoryRegisters:
    """A :class:`RegisterFile` over a uint32 array that someone else (firmware, a simulator) also uses."""

    def __init__(self, words: np.ndarray | int) -> None:
        array = np.zeros(words, dtype=np.uint32) if isinstance(words, int) else words
        if array.dtype != np.uint32 or array.ndim != 1:
            raise ValueError(
                f"expected a 1-D uint32 array, got {array.dtype} with shape {array.shape}"
            )
        self.words = array

    def _check(self, index: int) -> None:
        if not 0 <= index < len(self.words):
            raise IndexError(f"register index {index} outside 0..{len(self.words) - 1}")

    async def read(self, index: int) -> int:
        self._check(index)
        return int(self.words[index])

    async def write(self, index: int, value: int) -> None:
        self._check(index)
        if not 0 <= value <= _MASK32:
            raise ValueError(f"register value must fit in 32 bits, got {value!r}")
        self.words[index] = value


class _RegisterBound(TypedDict, total=False):
    """:func:`wait_register`'s own bound: an :class:`OwnBound` whose error defaults."""

    awaited: Required[str]
    error: type[HardwareTimeout]
    timeout: float | None
    layer: Layer | None


@overload
async def wait_register(
    registers: RegisterFile,
    index: int,
    *,
    mask: int = ...,
    value: int,
    policy: PollPolicy = ...,
    **bounding: Unpack[_RegisterBound],
) -> int: ...


@overload
async def wait_register(
    registers: RegisterFile,
    index: int,
    *,
    mask: int = ...,
    value: int,
    policy: PollPolicy = ...,
    **bounding: Unpack[SharedBound],
) -> int: ...


async def wait_register(
    registers: RegisterFile,
    index: int,
    *,
    mask: int = _MASK32,
    value: int,
    policy: PollPolicy = DEFAULT_POLICY,
    **bounding: Unpack[BoundArgs],
) -> int:
    """Poll a register until ``(register & mask) == value``; return the full register value.

    Bounded by its :class:`~aio_runtime.BoundArgs`: ``awaited``, and either a bound of its own
    (``timeout``, ``layer``, and ``error``, :class:`FirmwareTimeout` unless given) or ``within``."""
    if bounding.get("within") is None:
        bounding.setdefault("error", FirmwareTimeout)
    observed: int = await probe_until(
        "wait_register",
        lambda: registers.read(index),
        lambda v: (v & mask) == value,
        bounding,
        expected=value,
        policy=policy,
    )
    return observed


@dataclass(frozen=True)
class MailboxLayout:
    """Register indices of one mailbox."""

    message: int
    argument: int
    response: int


class Mailbox:
    """Request/response over registers, one request at a time.

    ``success`` is the response code that means OK; ``pending`` is what the host writes into the
    response register before a request (and what firmware leaves there until it answers).
    ``codes`` names response codes for error messages. ``timeout`` is the default bound of
    :meth:`send` — of the whole send: waiting for an earlier send, the register writes, the
    response.

    Firmware handles one message at a time. When a send ends without its response after writing its
    message (a timeout, a cancelled task), the firmware may still be working on that message, and
    its answer would be read as the answer to the next one. So the next send first waits — within
    its own bound — for that outstanding response, and only then writes its message. Firmware that
    never answers keeps failing sends, as it should, until the device is reset and :meth:`reset`
    called (a new session builds a new mailbox anyway).
    """

    def __init__(
        self,
        registers: RegisterFile,
        layout: MailboxLayout,
        *,
        name: str,
        timeout: float,
        success: int = 1,
        pending: int = 0,
        codes: Mapping[int, str] | None = None,
        layer: Layer = Layer.FIRMWARE,
        policy: PollPolicy = DEFAULT_POLICY,
    ) -> None:
        if success == pending:
            raise ValueError("the success code must differ from the pending code")
        self.registers = registers
        self.layout = layout
        self.name = name
        self.timeout = validate_timeout(timeout)
        self.success = success
        self.pending = pending
        self.codes = dict(codes or {})
        self.layer = layer
        self.policy = policy
        self._lock = anyio.Lock()
        self._outstanding: int | None = None
        """Message id whose response was never read (its send timed out or was cancelled)."""

    def describe(self, code: int) -> str:
        return f"0x{code:x} ({self.codes[code]})" if code in self.codes else f"0x{code:x}"

    def _response(self) -> Awaitable[int]:
        return self.registers.read(self.layout.response)

    async def send(
        self,
        message: int,
        argument: int = 0,
        *,
        timeout: float | None = None,
        read_argument: bool = False,
    ) -> int:
        """Send ``message`` with ``argument`` and wait for success.

        Returns the argument register read back when ``read_argument`` (firmware replies there),
        else the response code. Raises :class:`FirmwareError` for any other response code, at once,
        and :class:`FirmwareTimeout` (or ``BudgetExhausted``) when the whole send does not finish
        within its bound.
        """
        awaited = f"{self.name} mailbox response to message 0x{message:x} (argument 0x{argument:x})"
        bound = WaitBound(
            awaited=awaited,
            error=FirmwareTimeout,
            timeout=self.timeout if timeout is None else timeout,
            layer=self.layer,
        )
        await bound.run(
            self._lock.acquire(),
            awaited=f"{self.name} mailbox free (another send in progress) to send 0x{message:x}",
        )
        try:
            if self._outstanding is not None:
                await wait_until(
                    self._response,
                    lambda v: v != self.pending,
                    awaited=f"{self.name} mailbox response to the earlier message "
                    f"0x{self._outstanding:x}, before sending 0x{message:x}",
                    within=bound,
                    policy=self.policy,
                )
                self._outstanding = None
            regs, layout = self.registers, self.layout
            await bound.run(regs.write(layout.response, self.pending), awaited=f"{awaited}: write")
            await bound.run(regs.write(layout.argument, argument), awaited=f"{awaited}: write")
            # From here the firmware may have the message, whatever happens to this send.
            self._outstanding = message
            await bound.run(regs.write(layout.message, message), awaited=f"{awaited}: write")
            response = await wait_until(
                self._response,
                lambda v: v != self.pending,
                awaited=awaited,
                within=bound,
                expected=self.success,
                policy=self.policy,
            )
            self._outstanding = None
            if response != self.success:
                raise FirmwareError(
                    f"{awaited}: firmware answered {self.describe(response)}, "
                    f"expected {self.describe(self.success)}",
                    code=response,
                    awaited=awaited,
                    layer=self.layer,
                )
            if read_argument:
                return await bound.run(
                    regs.read(layout.argument), awaited=f"{awaited}: read argument"
                )
            return response
        finally:
            self._lock.release()

    def reset(self) -> None:
        """Forget a message whose answer never came (after the firmware or device was reset)."""
        self._outstanding = None
