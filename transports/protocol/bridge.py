"""The USB-PCIe bridge's wire protocol (spec hardware-waits §4.2-4.4 and §4.8): what the host sends
and the bridge answers. Where the spec only names a thing, the layout is ours and is documented
here. The host (:mod:`transports.bridge`) packs with these helpers and the simulated bridge
(:mod:`transports.sim.bridge`) parses with them, so the two sides cannot drift apart.

Controller memory ("XDATA", 64 KiB), read with :attr:`VendorRequest.READ_XDATA` and written a
byte at a time with :attr:`VendorRequest.WRITE_XDATA`:

=============  ==========================================================================
0xA000-0xAFFF  the 4 KiB *sys page*, also visible to the GPU at PCIe 0x820000; the copy
               protocol's chunk fence is the dword at +0x800 (XDATA 0xA800, PCIe 0x820800)
0xB450         the LTSSM (link state) byte: 0x78 once the PCIe link is up
=============  ==========================================================================

Bridge memory reached only from the PCIe side (the GPU's DMA):

- the *cq page*, 0x200 bytes at PCIe 0x822000: a write of 0 to its dword at +12 (PCIe 0x82200C)
  releases an armed SRAM read;
- the 512 KiB SRAM at PCIe 0x200000, 32 slots of 16 KiB (halves at slot 0 and slot 16). The host
  reaches it only through the DMA engine: arm with :attr:`VendorRequest.ARM_SRAM`, then move the
  data on the bulk endpoints.

Vendor requests (bmRequestType 0x40 out, 0xC0 in):

- ``0xE4`` in (``READ_XDATA``): ``wValue`` = XDATA address, up to :data:`MAX_XDATA_READ` bytes.
- ``0xE5`` out (``WRITE_XDATA``): ``wValue`` = XDATA address, ``wIndex`` = the byte.
- ``0xF3`` out (``POWER``): PCIe power, ``wValue`` 1 = on, 0 = off. The link trains some time after
  power-on (the LTSSM byte reads :data:`LINK_UP` from then on).
- ``0xF0`` out (``PCIE``): a PCIe request, a :class:`Tlp` (:func:`pack_tlp`). ``wValue`` = TLP
  fmt/type | byte-enables << 8 (the enabled byte lanes of the dword at the dword-aligned address;
  data sits in its lanes); ``wIndex`` = the :class:`StreamMode`: 0 one TLP, 1 streaming memory
  write (the data follows on bulk OUT), 2 streaming memory read (the data comes back on bulk IN).
  Data: 12 bytes = address low, address high, and the value (mode 0) or the dword count (modes 1,
  2), little-endian u32 each.
- ``0xF0`` in: 8 bytes, the :class:`PcieCompletion` of the last non-posted TLP: u32 data, the
  :class:`CompletionStatus` in bits 5-7 of byte 4, and the bridge's own return status in byte 7
  (non-zero: "busy, retry the request").
- ``0xF2`` out (``ARM_SRAM``): arm the SRAM DMA engine for the next bulk transfer, an
  :class:`SramArm` (:func:`pack_arm`). ``wValue`` = number of 512-byte sectors, bit 15 set for a
  read (SRAM to host); ``wIndex`` = start slot | slot count << 8. An armed write takes the next
  bulk OUT into SRAM; an armed read answers the next bulk IN only once the GPU has released it
  through the cq page.

Configuration TLPs carry bus/device/function in the address (:func:`config_address`); type
0x04/0x44 (read/write, type 0: bus 0), 0x05/0x45 (type 1: the buses behind it).

The host packs (``pack_*``) with plain functions that return what goes on the wire — some run
once per copy chunk — and the simulator unpacks (``unpack_*``) into named tuples.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

__all__ = [
    "BRIDGE_IDS",
    "BRIDGE_PRODUCTS",
    "COMPLETION_SIZE",
    "CQ_PCIE",
    "CQ_RELEASE_PCIE",
    "CQ_SIZE",
    "EP_BULK_IN",
    "EP_BULK_OUT",
    "FENCE_PCIE",
    "FENCE_XDATA",
    "LINK_UP",
    "LTSSM_XDATA",
    "MAX_XDATA_READ",
    "SECTOR",
    "SLOT",
    "SRAM_PCIE",
    "SRAM_SIZE",
    "SRAM_SLOTS",
    "SYS_PCIE",
    "SYS_SIZE",
    "SYS_XDATA",
    "TLP_SIZE",
    "XDATA_SIZE",
    "CompletionStatus",
    "PcieCompletion",
    "SramArm",
    "StreamMode",
    "Tlp",
    "TlpType",
    "VendorRequest",
    "byte_enables",
    "completion_name",
    "config_address",
    "enabled_lanes",
    "pack_arm",
    "pack_completion",
    "pack_tlp",
    "parse_config_address",
    "unpack_arm",
    "unpack_completion",
    "unpack_tlp",
]

# -- identity and endpoints ----------------------------------------------------------------------
BRIDGE_IDS = ((0xADD1, 0x0001), (0x3801, 0x0001))
"""USB vendor:product of the bridges the host opens (spec §4.2); the first is the simulator's."""
BRIDGE_PRODUCTS = ("custom", "AS2462")
"""What the bridge's product string starts with."""
EP_BULK_OUT, EP_BULK_IN = 0x02, 0x81

# -- memory --------------------------------------------------------------------------------------
XDATA_SIZE = 0x10000
"""Controller memory ("XDATA")."""
MAX_XDATA_READ = 0xFF
"""The most bytes one ``READ_XDATA`` request returns."""
SYS_XDATA, SYS_PCIE, SYS_SIZE = 0xA000, 0x820000, 0x1000
"""The sys page: controller memory the GPU also reaches over PCIe."""
FENCE_XDATA, FENCE_PCIE = SYS_XDATA + 0x800, SYS_PCIE + 0x800
"""The copy protocol's chunk fence in the sys page."""
LTSSM_XDATA, LINK_UP = 0xB450, 0x78
CQ_PCIE, CQ_SIZE = 0x822000, 0x200
CQ_RELEASE_PCIE = CQ_PCIE + 12
"""A GPU write of 0 here releases an armed SRAM read."""
SRAM_PCIE, SRAM_SIZE, SLOT, SECTOR = 0x200000, 0x80000, 0x4000, 512
"""Bridge SRAM: 32 slots of 16 KiB, moved in 512-byte sectors by the DMA engine."""
SRAM_SLOTS = SRAM_SIZE // SLOT


# -- vendor requests -----------------------------------------------------------------------------
class VendorRequest(enum.IntEnum):
    """The bridge's vendor requests (``bRequest``)."""

    READ_XDATA = 0xE4
    WRITE_XDATA = 0xE5
    PCIE = 0xF0
    ARM_SRAM = 0xF2
    POWER = 0xF3


class StreamMode(enum.IntEnum):
    """``wIndex`` of a ``PCIE`` request: one TLP, or a stream whose data rides a bulk endpoint."""

    SINGLE = 0
    WRITE = 1
    READ = 2


# -- PCIe requests -------------------------------------------------------------------------------
class TlpType(enum.IntEnum):
    """TLP fmt/type values (the low byte of ``wValue``)."""

    MRD32 = 0x00
    MRD64 = 0x20
    MWR32 = 0x40
    MWR64 = 0x60
    CFG_READ0 = 0x04
    CFG_READ1 = 0x05
    CFG_WRITE0 = 0x44
    CFG_WRITE1 = 0x45

    @classmethod
    def memory(cls, address: int, *, write: bool) -> TlpType:
        """A memory request: 64-bit addressing where the address needs it."""
        return _MEMORY[write][address >> 32 != 0]

    @classmethod
    def config(cls, bus: int, *, write: bool) -> TlpType:
        """A configuration request: type 0 reaches bus 0 only, type 1 the buses behind it."""
        return _CONFIG[write][bus > 0]

    @property
    def posted(self) -> bool:
        """A memory write: no completion comes back."""
        return self in _POSTED

    @property
    def is_memory(self) -> bool:
        return self in _MEMORY_TYPES

    @property
    def config_type(self) -> int:
        """0 or 1 for a configuration request (bit 0 of the type)."""
        return self & 1


# Looked up, not spelled as enum attributes: the host builds a TLP per register access.
_MEMORY = ((TlpType.MRD32, TlpType.MRD64), (TlpType.MWR32, TlpType.MWR64))
_CONFIG = ((TlpType.CFG_READ0, TlpType.CFG_READ1), (TlpType.CFG_WRITE0, TlpType.CFG_WRITE1))
_POSTED = frozenset(_MEMORY[True])
_MEMORY_TYPES = frozenset(_MEMORY[False] + _MEMORY[True])


TLP_SIZE = 12
"""The data stage of a ``PCIE`` request."""
_TLP = struct.Struct("<III")


class Tlp(NamedTuple):
    """One ``PCIE`` request, as the bridge parses it (:func:`unpack_tlp`). ``word`` is the value (a
    single TLP) or the dword count (a stream)."""

    fmt_type: int
    address: int
    word: int = 0
    byte_enables: int = 0

    @property
    def kind(self) -> TlpType | None:
        """The request's type, if the protocol has it."""
        return _TLP_TYPES.get(self.fmt_type)


def pack_tlp(fmt_type: int, address: int, word: int = 0, enables: int = 0) -> tuple[int, bytes]:
    """The ``wValue`` and the :data:`TLP_SIZE`-byte data stage of a ``PCIE`` request."""
    return fmt_type | enables << 8, _TLP.pack(address & 0xFFFF_FFFF, address >> 32, word)


def unpack_tlp(value: int, data: bytes) -> Tlp:
    low, high, word = _TLP.unpack(data)
    return Tlp(value & 0xFF, high << 32 | low, word, (value >> 8) & 0xFF)


_TLP_TYPES = {int(kind): kind for kind in TlpType}


def byte_enables(address: int, size: int) -> int:
    """The byte lanes a single TLP of ``size`` bytes at ``address`` enables."""
    if size not in (1, 2, 4) or (address & 3) + size > 4:
        raise ValueError(
            f"a single TLP moves 1, 2 or 4 bytes within a dword, got {size} at 0x{address:x}"
        )
    return ((1 << size) - 1) << (address & 3)


def enabled_lanes(enables: int) -> tuple[int, int]:
    """The first enabled byte lane and how many are enabled (none enabled: the whole dword)."""
    lanes = enables & 0xF or 0xF
    return (lanes & -lanes).bit_length() - 1, bin(lanes).count("1")


def config_address(bus: int, device: int, function: int, register: int) -> int:
    """Where a configuration TLP points: ``bus << 24 | device << 19 | function << 16 |
    register`` (the register's dword)."""
    if not (0 <= bus < 256 and 0 <= device < 32 and 0 <= function < 8 and 0 <= register < 0x1000):
        raise ValueError(f"no such configuration address {bus}:{device}.{function} +0x{register:x}")
    return bus << 24 | device << 19 | function << 16 | (register & 0xFFC)


def parse_config_address(address: int) -> tuple[int, int, int, int]:
    """(bus, device, function, register) of a configuration TLP's address."""
    return (address >> 24) & 0xFF, (address >> 19) & 0x1F, (address >> 16) & 0x7, address & 0xFFC


# -- completions ---------------------------------------------------------------------------------
class CompletionStatus(enum.IntEnum):
    SUCCESS = 0
    UNSUPPORTED_REQUEST = 1
    CONFIG_RETRY = 2
    COMPLETER_ABORT = 4


_COMPLETION_NAMES: dict[int, str] = {
    CompletionStatus.UNSUPPORTED_REQUEST: "unsupported request",
    CompletionStatus.CONFIG_RETRY: "configuration retry",
    CompletionStatus.COMPLETER_ABORT: "completer abort",
}


def completion_name(status: int) -> str:
    """What a completion status means, in words."""
    return _COMPLETION_NAMES.get(status, "unknown status")


COMPLETION_SIZE = 8
_COMPLETION = struct.Struct("<IBBBB")


class PcieCompletion(NamedTuple):
    """The answer to ``PCIE`` in: the last non-posted TLP's data and status, and the bridge's own
    return status (non-zero: busy, retry)."""

    data: int
    status: int = CompletionStatus.SUCCESS
    bridge_status: int = 0

    def __str__(
        self,
    ) -> str:  # a timeout reports the last one seen as (data, status, bridge status)
        return str(tuple(self))


def pack_completion(
    data: int, status: int = CompletionStatus.SUCCESS, bridge_status: int = 0
) -> bytes:
    return _COMPLETION.pack(data & 0xFFFF_FFFF, status << 5, 0, 0, bridge_status)


def unpack_completion(raw: bytes) -> PcieCompletion:
    data, status_byte, _, _, bridge_status = _COMPLETION.unpack(raw)
    return PcieCompletion(data, status_byte >> 5, bridge_status)


# -- the SRAM DMA engine -------------------------------------------------------------------------
class SramArm(NamedTuple):
    """An ``ARM_SRAM`` request: ``sectors`` of 512 bytes at ``slot`` (``slots`` slots reserved),
    to the host (``read``) or from it."""

    read: bool
    slot: int
    slots: int
    sectors: int


def pack_arm(read: bool, slot: int, slots: int, sectors: int) -> tuple[int, int]:
    """The ``wValue`` and ``wIndex`` of an ``ARM_SRAM`` request (a plain function: the copy
    protocol arms once per chunk)."""
    return sectors | (0x8000 if read else 0), slot | slots << 8


def unpack_arm(value: int, index: int) -> SramArm:
    return SramArm(bool(value & 0x8000), index & 0xFF, index >> 8, value & 0x7FFF)
