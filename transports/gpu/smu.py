"""The SMU (spec hardware-waits §5.2) through its mailbox, as a boot talks to it.

The messages a boot sends (a test, the driver table's address, enabling the features) are
idempotent, so :func:`send_smu` sends one again each time it goes unanswered for
``smu_probe_timeout``, all within ``firmware_timeout``: an SMU that stopped answering for a while
is picked up again within one probe period of its return, where a message it never answered would
wait out the whole bound. (The mode-1 reset is not one of them: it is written, never awaited.)
"""

from __future__ import annotations

from aio_runtime import (
    FirmwareTimeout,
    Mailbox,
    MailboxLayout,
    PollPolicy,
    RegisterFile,
    WaitBound,
)

from ..protocol import gpu as hw
from .config import SessionConfig

__all__ = ["FIRMWARE_POLICY", "send_smu", "smu_answers", "smu_mailbox"]

FIRMWARE_POLICY = PollPolicy(spin=0, first_interval=0.0005, max_interval=0.01)
"""How firmware registers and mailboxes are polled."""


def smu_mailbox(regs: RegisterFile, timeout: float) -> Mailbox:
    return Mailbox(
        regs,
        MailboxLayout(message=hw.SMU_MSG // 4, argument=hw.SMU_ARG // 4, response=hw.SMU_RESP // 4),
        name="SMU",
        timeout=timeout,
        success=hw.SMU_OK,
        policy=FIRMWARE_POLICY,
        codes={0xFF: "failed", 0xFE: "unknown message", 0xFD: "command rejected"},
    )


async def send_smu(
    smu: Mailbox, config: SessionConfig, message: hw.SmuMessage, argument: int = 0
) -> None:
    """Send an idempotent SMU message until it is answered: again each time it goes unanswered
    for ``config.smu_probe_timeout``, within ``config.firmware_timeout`` as a whole (and the
    enclosing deadline). An error code is raised at once (:class:`~aio_runtime.FirmwareError`);
    no answer within the bound is a :class:`~aio_runtime.FirmwareTimeout` that says how many
    times the message was sent."""
    awaited = f"SMU mailbox response to message 0x{message:x} (argument 0x{argument:x})"
    bound = WaitBound(awaited=awaited, error=FirmwareTimeout, timeout=config.firmware_timeout)
    sends = 0
    while True:
        sends += 1
        try:
            await smu.send(
                message, argument, timeout=min(config.smu_probe_timeout, bound.remaining())
            )
            return
        except FirmwareTimeout as unanswered:
            if bound.remaining() > 0:
                smu.reset()  # the same message again: a late answer to the first one is its own
                continue
            bound.note(
                f"{awaited} (sent {sends} times, each unanswered for {config.smu_probe_timeout} s)"
            )
            raise bound.timed_out() from unanswered


async def smu_answers(smu: Mailbox, timeout: float) -> bool:
    """Whether SMU firmware runs: it answers one test message within ``timeout``."""
    try:
        await smu.send(hw.SmuMessage.TEST, timeout=timeout)
    except FirmwareTimeout:
        smu.reset()  # no SMU firmware runs: nothing will answer the probe later either
        return False
    return True
