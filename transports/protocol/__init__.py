"""The wire protocols between the host and the hardware, defined once for both sides: the host
(:mod:`transports.bridge`, :mod:`transports.gpu`, the USB backends) speaks them and the simulator
(:mod:`transports.sim`) answers them.

- :mod:`transports.protocol.bridge` — the USB-PCIe bridge: its USB identity and endpoints, its
  vendor requests, the PCIe requests they carry, its memory map.
- :mod:`transports.protocol.gpu` — the GPU behind it: addresses, registers, packets, firmware.
"""
