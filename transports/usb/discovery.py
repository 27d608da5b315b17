"""Finding the USB-PCIe bridge on the bus, the same way in every backend: a device with one of the
bridge's ids (:data:`~transports.protocol.bridge.BRIDGE_IDS`) whose product string starts with one
of the bridge's names (:data:`~transports.protocol.bridge.BRIDGE_PRODUCTS`), and one error,
:class:`aio_runtime.DeviceLost`, when there is none, saying what was looked for and skipped.
"""

from __future__ import annotations

from collections.abc import Iterable

from aio_runtime import DeviceLost, Layer

from ..protocol.bridge import BRIDGE_IDS, BRIDGE_PRODUCTS

__all__ = ["BridgeSearch"]


class BridgeSearch:
    """One search of the bus. ``products`` None: any product string will do (it need not be
    read)."""

    awaited = "open the USB-PCIe bridge"

    def __init__(
        self,
        ids: Iterable[tuple[int, int]] = BRIDGE_IDS,
        products: tuple[str, ...] | None = BRIDGE_PRODUCTS,
    ) -> None:
        self.ids = frozenset(ids)
        self.products = products
        self.skipped: list[str] = []
        """Devices with a bridge's id whose product string is not a bridge's."""

    def wanted(self, vendor: int, product: int) -> bool:
        """Whether a device with these ids may be the bridge."""
        return (vendor, product) in self.ids

    def named(self, vendor: int, product: int, name: str) -> bool:
        """Whether a wanted device's product string ``name`` is a bridge's; one that is not is
        noted for :meth:`not_found`."""
        if self.products is None or name.startswith(self.products):
            return True
        self.skipped.append(f"{vendor:04x}:{product:04x} {name!r}")
        return False

    def not_found(self) -> DeviceLost:
        looked_for = ", ".join(f"{v:04x}:{p:04x}" for v, p in sorted(self.ids))
        detail = f"; skipped (product string): {', '.join(self.skipped)}" if self.skipped else ""
        return DeviceLost(
            f"no USB-PCIe bridge on the bus (looked for {looked_for}){detail}",
            layer=Layer.USB_TRANSFER,
            awaited=self.awaited,
        )
