"""transports — how bytes and commands reach hardware (USB, the USB-PCIe bridge, the copy protocol,
the GPU device session, the simulator). Built on ``aio_runtime``; never imports ``pipelines``."""

from aio_runtime import __version__ as __version__
