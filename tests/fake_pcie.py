"""A minimal PCIe function for bridge tests: config space and a window of memory."""

from __future__ import annotations


class FakeGpu:
    """A PCIe function on bus 4 with a config space and 1 MiB of memory at 0x10000000."""

    BASE, SIZE = 0x1000_0000, 1 << 20

    def __init__(self):
        self.config = {0x00: 0x7550_1002}  # device:vendor
        self.memory = bytearray(self.SIZE)
        self.config_writes = []

    def config_read(self, bus, device, function, register):
        if (bus, device, function) != (4, 0, 0) or register not in self.config:
            raise LookupError
        return self.config[register]

    def config_write(self, bus, device, function, register, value, byte_enables):
        if (bus, device, function) != (4, 0, 0):
            raise LookupError
        self.config_writes.append((register, value, byte_enables))

    def _offset(self, address, size):
        if not (self.BASE <= address and address + size <= self.BASE + self.SIZE):
            raise LookupError
        return address - self.BASE

    def memory_read(self, address, size):
        offset = self._offset(address, size)
        return bytes(self.memory[offset : offset + size])

    def memory_write(self, address, data):
        offset = self._offset(address, len(data))
        self.memory[offset : offset + len(data)] = data
