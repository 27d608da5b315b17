"""The simulated GPU's firmware: the SMU and PSP mailboxes (spec hardware-waits §5.2-5.3).

Both answer after a configurable latency, on the simulation's loop. The SMU answers only once the
PSP has loaded its firmware (before that a message goes unanswered, which is how a host tells a
fresh GPU from one somebody initialised). A mode-1 reset (SMU message) returns both to that fresh
state.

Faults: ``SMU_NO_RESPONSE`` (a message is never answered), ``SMU_ERROR_CODE`` (answered with
``code``, default 0xFF), ``PSP_RING_TIMEOUT`` (a ring submission's fence is never written),
``PSP_ERROR_STATUS`` (a submission completes with ``status``, default 0x1).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..protocol import gpu as hw
from .faults import Fault

if TYPE_CHECKING:
    from .gpu import SimGpu

__all__ = ["SimPsp", "SimSmu"]


class SimSmu:
    def __init__(self, gpu: SimGpu, latency: float) -> None:
        self.gpu = gpu
        self.latency = latency
        self.loaded = False
        self.features = False
        self.messages: list[tuple[int, int]] = []
        """Every message received, as (message, argument)."""
        self.registers = {hw.SMU_MSG: 0, hw.SMU_ARG: 0, hw.SMU_RESP: 0}

    def reset(self) -> None:
        self.loaded = self.features = False
        self.registers = dict.fromkeys(self.registers, 0)

    def write(self, offset: int, value: int) -> None:
        self.registers[offset] = value
        if offset == hw.SMU_MSG:
            self.messages.append((value, self.registers[hw.SMU_ARG]))
            self.gpu.later(self.latency, self._answer, value, self.registers[hw.SMU_ARG])

    def _answer(self, message: int, argument: int) -> None:
        if not self.loaded:
            return  # no SMU firmware runs yet: nobody answers
        plan = self.gpu.plan
        if plan.check(Fault.SMU_NO_RESPONSE):
            return
        rule = plan.check(Fault.SMU_ERROR_CODE)
        if rule is not None:
            code = rule.params.get("code", 0xFF)
            self.registers[hw.SMU_RESP] = int(code) if isinstance(code, int) else 0xFF
            return
        if message == hw.SmuMessage.ENABLE_ALL_FEATURES:
            self.features = True
        elif message == hw.SmuMessage.GET_VERSION:
            self.registers[hw.SMU_ARG] = 0x004C_5400
        elif message == hw.SmuMessage.MODE1_RESET:
            self.gpu.mode1_reset()
            return  # the reset takes the SMU with it; it answers nothing
        self.registers[hw.SMU_RESP] = hw.SMU_OK


class SimPsp:
    def __init__(self, gpu: SimGpu, latency: float) -> None:
        self.gpu = gpu
        self.latency = latency
        self.registers: dict[int, int] = {}
        self.loaded: list[int] = []
        """Components the bootloader loaded, then firmware the ring loaded (command, argument)."""
        self.commands: list[tuple[int, int]] = []
        self.reset()

    def reset(self) -> None:
        self.registers = {
            hw.PSP_BL: hw.PSP_READY,
            hw.PSP_BL_ADDR: 0,
            hw.PSP_RING_CTL: 0,
            hw.PSP_RING_WPTR: 0,
            hw.PSP_RING_LO: 0,
            hw.PSP_RING_HI: 0,
            hw.PSP_RING_SIZE: 0,
            hw.PSP_SOS: 0,
        }
        self.loaded = []
        self.commands = []
        self._served = 0

    @property
    def sos_alive(self) -> bool:
        return self.registers[hw.PSP_SOS] != 0

    def write(self, offset: int, value: int) -> None:
        previous = self.registers.get(offset, 0)
        self.registers[offset] = value
        if offset == hw.PSP_BL:
            self.registers[hw.PSP_BL] = value & ~hw.PSP_READY  # busy until loaded
            self.gpu.later(self.latency, self._load_component, value)
        elif offset == hw.PSP_RING_CTL and value and self.sos_alive:
            self.registers[hw.PSP_RING_CTL] = 0
            self.gpu.later(self.latency, self._create_ring)
        elif offset == hw.PSP_RING_WPTR and value > previous:
            self.gpu.later(self.latency, self._serve)

    def _load_component(self, component: int) -> None:
        image = self.gpu.bridge_sram(self.registers[hw.PSP_BL_ADDR] << 20)
        if int.from_bytes(image, "little") != component:
            return  # not the image it was told to load: the bootloader stays busy
        self.loaded.append(component)
        if component == hw.PspComponent.SOS:
            self.registers[hw.PSP_SOS] = 1  # the sOS runs; the bootloader is done
        else:
            self.registers[hw.PSP_BL] = hw.PSP_READY

    def _create_ring(self) -> None:
        """A new ring (replacing any earlier one): its frames count from 0."""
        self._served = 0
        self.registers[hw.PSP_RING_CTL] = hw.PSP_RING_CREATED

    def _serve(self) -> None:
        ring = self.registers[hw.PSP_RING_HI] << 32 | self.registers[hw.PSP_RING_LO]
        frames = max(1, self.registers[hw.PSP_RING_SIZE] // hw.PSP_FRAME_SIZE)
        read: Callable[[int, int], bytes] = lambda a, n: bytes(self.gpu.read(a, n))  # noqa: E731
        while self._served < self.registers[hw.PSP_RING_WPTR]:
            self._served += 1
            try:
                frame = read(ring + ((self._served - 1) % frames) * hw.PSP_FRAME_SIZE, 20)
                cmd_lo, cmd_hi, fence_lo, fence_hi, fence_value = struct.unpack("<5I", frame)
                command = cmd_hi << 32 | cmd_lo
                cmd_id, arg_lo, _ = struct.unpack("<3I", read(command, 12))
            except LookupError:
                continue  # a frame or command nowhere in memory: nothing to answer, no fence
            plan = self.gpu.plan
            if plan.check(Fault.PSP_RING_TIMEOUT):
                continue  # the fence is never written
            rule = plan.check(Fault.PSP_ERROR_STATUS)
            status = 0
            if rule is not None:
                param = rule.params.get("status", 1)
                status = int(param) if isinstance(param, int) else 1
            elif self.gpu.firmware_loaded(cmd_id, arg_lo):
                self.commands.append((cmd_id, arg_lo))
            else:
                status = 0x2  # invalid parameter
            self.gpu.write(command + hw.PSP_RESPONSE_OFFSET, struct.pack("<I", status))
            self.gpu.write(fence_hi << 32 | fence_lo, struct.pack("<I", fence_value))
