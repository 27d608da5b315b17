"""The GPU's hardware interface as this project models it: addresses, registers, packets.

The simulated GPU (:mod:`transports.sim.gpu`) implements it and the device session
(:mod:`transports.gpu`) drives it. Spec hardware-waits §3-5 names the pieces (SMU and PSP mailbox
registers, scratch registers, rings, the copy engine's POLL/COPY/WRITE/FENCE, the compute queue's
dispatch and release); where it names them only, the layout below is ours.

PCIe addresses (the GPU is bus 4, device 0, behind the bridge's ports on buses 0-3; BARs are
pre-assigned): MMIO registers at :data:`MMIO_BASE` (1 MiB of dword registers), VRAM at
:data:`VRAM_BASE`. The GPU addresses memory by these same bus addresses (an identity mapping, as
tinygrad's ``GMMU=0``): VRAM, and the bridge's sys page, cq page and SRAM
(:mod:`transports.protocol.bridge`).

Packets are little-endian dwords. The header dword is ``opcode | argument << 8``. Ring pointers are
byte counts that only grow; a packet's dwords sit at ``pointer % ring size`` and may wrap.
"""

from __future__ import annotations

import enum

__all__ = [
    "AM_VERSION",
    "CNTL_ENABLE",
    "CNTL_RESET",
    "COMPUTE",
    "GPU_BUS",
    "GPU_DEVICE",
    "GPU_FUNCTION",
    "GPU_ID",
    "IH",
    "IH_CNTL",
    "IH_ENTRIES",
    "IH_ENTRY",
    "IH_RPTR",
    "IH_WPTR",
    "MMIO_BASE",
    "MMIO_SIZE",
    "POLL_EQUAL",
    "POLL_GREATER_EQUAL",
    "PSP_BL",
    "PSP_BL_ADDR",
    "PSP_FRAME_SIZE",
    "PSP_READY",
    "PSP_RESPONSE_OFFSET",
    "PSP_RING_CREATED",
    "PSP_RING_CTL",
    "PSP_RING_HI",
    "PSP_RING_LO",
    "PSP_RING_SIZE",
    "PSP_RING_WPTR",
    "PSP_SOS",
    "RB_CNTL",
    "RB_HI",
    "RB_LO",
    "RB_RPTR",
    "RB_SIZE",
    "RB_STATUS",
    "RB_WPTR",
    "SCRATCH_REG6",
    "SCRATCH_REG7",
    "SDMA",
    "SDMA_SIZES",
    "SDMA_WATCHDOG",
    "SMU_ARG",
    "SMU_MSG",
    "SMU_OK",
    "SMU_RESP",
    "STATUS_COPY_FENCE",
    "STATUS_ERROR",
    "STATUS_HALTED",
    "STATUS_PAGE_SIZE",
    "STATUS_TIMELINE",
    "STATUS_USB_GO",
    "VM_FAULT_STATUS",
    "VRAM_BASE",
    "VRAM_SIZE_MB",
    "Firmware",
    "Interrupt",
    "Pm4",
    "PspCommand",
    "PspComponent",
    "Sdma",
    "SmuMessage",
    "pack_u64",
]

# -- identity ------------------------------------------------------------------------------------
GPU_BUS, GPU_DEVICE, GPU_FUNCTION = 4, 0, 0
GPU_ID = 0x7550_1002
"""Config dword 0 (device id << 16 | vendor id) of the simulated GPU."""

# -- address map ---------------------------------------------------------------------------------
MMIO_BASE, MMIO_SIZE = 0x1000_0000, 0x10_0000
VRAM_BASE = 0x8_0000_0000

# -- registers (byte offsets into MMIO) ------------------------------------------------------------
SCRATCH_REG6 = 0x0018
"""Non-zero while a session uses the GPU; a session that ends cleanly writes 0."""
SCRATCH_REG7 = 0x001C
"""The driver version stamp of the last boot (:data:`AM_VERSION`)."""
VM_FAULT_STATUS = 0x0020
"""GC VM L2 protection-fault status: non-zero after a page fault (forces a full boot)."""
VRAM_SIZE_MB = 0x0024
"""The VRAM size in MiB (what IP discovery reports)."""
AM_VERSION = 0xA000_0008

SMU_MSG, SMU_ARG, SMU_RESP = 0x1000, 0x1004, 0x1008  # MP1 C2PMSG_66 / _82 / _90

PSP_BL = 0x2000  # C2PMSG_35: bit 31 = bootloader ready; write a component id to load it
PSP_BL_ADDR = 0x2004  # C2PMSG_36: the component image's address >> 20
PSP_RING_CTL = 0x2008  # C2PMSG_64: write the ring type to create; reads 0x80000000 once created
PSP_RING_WPTR = 0x200C  # C2PMSG_67: frames written (the host advances it by one per submit)
PSP_RING_LO, PSP_RING_HI, PSP_RING_SIZE = 0x2010, 0x2014, 0x2018  # C2PMSG_69 / _70 / _71
PSP_SOS = 0x201C  # C2PMSG_81: non-zero once the secure OS runs
PSP_READY = 1 << 31
PSP_RING_CREATED = 0x8000_0000

# Queue blocks: ring base (lo, hi), ring size, write pointer (the doorbell), read pointer, control,
# status. Control: bit 0 enable, bit 1 reset (clears the ring pointers, status and halt).
SDMA, COMPUTE = 0x3000, 0x4000
RB_LO, RB_HI, RB_SIZE, RB_WPTR, RB_RPTR, RB_CNTL, RB_STATUS = 0x0, 0x4, 0x8, 0xC, 0x10, 0x14, 0x18
SDMA_WATCHDOG = SDMA + 0x1C
"""The copy engine's watchdog in milliseconds (0 = off); a poll that waits longer halts it."""
CNTL_ENABLE, CNTL_RESET = 1, 2
STATUS_HALTED = 1

IH = 0x5000
IH_WPTR, IH_RPTR, IH_CNTL = IH + 0x0, IH + 0x4, IH + 0x8
"""The interrupt ring lives in the GPU; the host reads entries through IH_ENTRY(i)."""
IH_ENTRIES = 64
IH_ENTRY = IH + 0x100
"""Dword ``IH_ENTRY + 4*(i % IH_ENTRIES)``: the source id of interrupt ``i`` (the ring holds the
last 64)."""

# -- the status page: where the GPU reports its queues to a polling host ---------------------------
# A 16-byte page in VRAM at a fixed place (the top of VRAM): the compute timeline (u32, written by
# RELEASE packets), the error word (non-zero: the device is in its error state; it holds the
# interrupt source that put it there), the copy engine's last fence (u32), and ``usb_go`` — the
# copy-out handshake word the host pokes (spec §4.6).
STATUS_TIMELINE, STATUS_ERROR, STATUS_COPY_FENCE, STATUS_USB_GO = 0, 4, 8, 12
STATUS_PAGE_SIZE = 0x1000


class Interrupt(enum.IntEnum):
    """Interrupt source ids in the IH ring (after AMD's, simplified)."""

    SDMA_TRAP = 0xE0
    CP_EOP = 0xB5
    SDMA_WATCHDOG = 0xF2
    SQ_ERROR = 0xEF
    UTCL2_FAULT = 0x92

    @property
    def is_error(self) -> bool:
        """Whether the source puts the device in its error state (AM's IH scan)."""
        return self not in (Interrupt.SDMA_TRAP, Interrupt.CP_EOP)


# -- copy engine (SDMA) packets ------------------------------------------------------------------
class Sdma(enum.IntEnum):
    POLL = 1
    """[POLL | function << 8, address lo, address hi, value, mask]: wait until
    ``(dword & mask) == value`` (function 0) or ``>= value`` (function 1)."""
    COPY = 2
    """[COPY, source lo, source hi, destination lo, destination hi, bytes]: linear copy."""
    WRITE = 3
    """[WRITE, address lo, address hi, value]: store one dword."""
    FENCE = 4
    """[FENCE, address lo, address hi, value]: store one dword once everything before it is done."""


POLL_EQUAL, POLL_GREATER_EQUAL = 0, 1
SDMA_SIZES = {Sdma.POLL: 5, Sdma.COPY: 6, Sdma.WRITE: 4, Sdma.FENCE: 4}


# -- compute queue packets ------------------------------------------------------------------------
class Pm4(enum.IntEnum):
    WAIT = 1
    """[WAIT | function << 8, address lo, address hi, value, mask]: as the copy engine's POLL."""
    DISPATCH = 0x10
    """[DISPATCH | argc << 8, kernel id, argc x (lo, hi)]: run a registered kernel."""
    RELEASE = 0x11
    """[RELEASE, address lo, address hi, value]: store the (32-bit) value when work before it is
    done: how a queue signals its timeline."""


def pack_u64(value: int) -> tuple[int, int]:
    return value & 0xFFFF_FFFF, value >> 32


# -- PSP ring frames ------------------------------------------------------------------------------
PSP_FRAME_SIZE = 32
"""A ring frame: command address (lo, hi), fence address (lo, hi), fence value, pad. The command
buffer: command id, argument lo, argument hi, and the response status the PSP writes at +12."""
PSP_RESPONSE_OFFSET = 12


class PspCommand(enum.IntEnum):
    LOAD_TOC = 0x20
    SETUP_TMR = 0x05
    LOAD_IP_FW = 0x06
    AUTOLOAD_RLC = 0x21


class Firmware(enum.IntEnum):
    """The argument of ``LOAD_IP_FW``: which block's firmware the PSP loads."""

    SMU = 1
    SDMA = 2
    MEC = 3
    RLC = 4


class PspComponent(enum.IntEnum):
    """sOS components loaded through the bootloader, in order (spec §5.3)."""

    KEY_DB = 0x80000
    TOC = 0x70000
    SYS_DRV = 0x10000
    SOC_DRV = 0xB0000
    INTF_DRV = 0xD0000
    DBG_DRV = 0xC0000
    RAS_DRV = 0xE0000
    SOS = 0x20000


class SmuMessage(enum.IntEnum):
    TEST = 0x01
    GET_VERSION = 0x02
    DRIVER_TABLE_HIGH = 0x04
    DRIVER_TABLE_LOW = 0x05
    ENABLE_ALL_FEATURES = 0x06
    MODE1_RESET = 0x2F


SMU_OK = 1
