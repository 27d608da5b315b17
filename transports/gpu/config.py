"""How a device session is configured: the bound of every wait and the pauses the hardware needs
(:class:`SessionConfig`), and where a session puts things in VRAM."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COMPUTE_RING",
    "HEAP_OFFSET",
    "PSP_COMMANDS",
    "PSP_FENCE",
    "PSP_RING",
    "RING_SIZE",
    "SDMA_RING",
    "SessionConfig",
]

# -- VRAM, from its base: the rings, the PSP's ring and buffers, then the heap --------------------
RING_SIZE = 0x10000
SDMA_RING, COMPUTE_RING, PSP_RING, PSP_COMMANDS, PSP_FENCE = 0, 0x10000, 0x20000, 0x21000, 0x22000
HEAP_OFFSET = 0x10_0000


@dataclass
class SessionConfig:
    """Bounds of every wait (seconds) and the pauses the hardware needs."""

    control_timeout: float = 1.0
    request_timeout: float = 5.0
    link_timeout: float = 2.0
    firmware_timeout: float = 10.0
    smu_probe_timeout: float = 0.1
    bulk_timeout: float = 10.0
    fence_timeout: float = 10.0
    kernel_timeout: float = 10.0
    copy_watchdog_ms: int = 10_000
    mode1_reset_pause: float = 0.5
    compute_ring_size: int = RING_SIZE
    """Bytes of compute-queue ring: a power of two, 64 B to 64 KiB (a dispatch is ~48 bytes)."""
    turn_timeout: float = 60.0
    """How long work waits for its turn on a queue (another copy, another submission)."""

    @property
    def channel_timeout(self) -> float:
        """How long a bridge channel may be waited for: longer than any holder keeps one (a
        copy chunk's bulk transfer, then a fence wait, then a diagnosis)."""
        return self.bulk_timeout + self.fence_timeout + 2 * self.request_timeout
