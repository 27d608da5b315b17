"""The kinds of hardware timeout and the layer each one reports by default."""

from aio_runtime import (
    CameraTimeout,
    FirmwareTimeout,
    Layer,
    ModelTimeout,
    PcieRequestTimeout,
    SignalTimeout,
    UsbTransferTimeout,
)

TIMEOUT_KINDS = [
    (UsbTransferTimeout, Layer.USB_TRANSFER),
    (PcieRequestTimeout, Layer.PCIE_REQUEST),
    (SignalTimeout, Layer.GPU_QUEUE),
    (FirmwareTimeout, Layer.FIRMWARE),
    (CameraTimeout, Layer.CAMERA),
    (ModelTimeout, Layer.MODEL),
]
