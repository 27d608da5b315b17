"""The typed fault family: every failure names the layer it came from and what was awaited.

Two lines are drawn sharply:

* ``HardwareTimeout`` (a :class:`TimeoutError`) — a device, bus or firmware did not answer within
  the wait's own timeout. One subclass per kind of wait.
* ``BudgetExhausted`` (also a :class:`TimeoutError`, but *not* a ``HardwareTimeout``) — an
  enclosing budget (a frame's deadline) ran out while something was awaited. No device was late by
  its own timeout; the work as a whole took too long.

Other faults: ``DeviceLost``, ``TransferError``, ``FirmwareError`` (a response code that is not
success), ``InvalidOutput``. Errors from third-party libraries are translated at the boundary with
:func:`map_exceptions`.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterator, Mapping

__all__ = [
    "BudgetExhausted",
    "CameraTimeout",
    "DeviceLost",
    "FirmwareError",
    "FirmwareTimeout",
    "HardwareTimeout",
    "InvalidOutput",
    "Layer",
    "ModelTimeout",
    "OutOfMemory",
    "PcieRequestTimeout",
    "RollbackFailed",
    "RuntimeFault",
    "SignalTimeout",
    "TransferError",
    "UnboundedWaitError",
    "UsbTransferTimeout",
    "map_exceptions",
]


class Layer(enum.Enum):
    """Where in the stack a wait or a fault lives."""

    USB_TRANSFER = "usb-transfer"
    PCIE_REQUEST = "pcie-request"
    GPU_QUEUE = "gpu-queue"
    FIRMWARE = "firmware"
    CAMERA = "camera"
    MODEL = "model"
    HOST = "host"

    def __str__(self) -> str:
        return self.value


def _fmt_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value} (0x{value:x})" if value > 9 else str(value)
    return repr(value) if isinstance(value, str) else str(value)


class RuntimeFault(Exception):
    """Base of every fault the runtime raises on purpose.

    ``layer`` says where it happened; ``awaited`` describes the operation in words a log reader
    understands (``"timeline signal 'compute' >= 42"``).
    """

    default_layer: Layer = Layer.HOST

    def __init__(self, message: str, *, layer: Layer | None = None, awaited: str = "") -> None:
        super().__init__(message)
        self.layer: Layer = layer if layer is not None else self.default_layer
        self.awaited = awaited

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return f"[{self.layer}] {self.message}"


class _TimedOut(RuntimeFault, TimeoutError):
    """Shared shape of the two timeout families: what, how long allowed, how long taken."""

    def __init__(
        self,
        *,
        awaited: str,
        timeout: float,
        elapsed: float,
        layer: Layer | None = None,
        expected: object = None,
        observed: object = None,
        detail: str = "",
    ) -> None:
        self.timeout = timeout
        self.elapsed = elapsed
        self.expected = expected
        self.observed = observed
        self.detail = detail
        self.in_flight = False
        """True when the timed-out operation did not acknowledge cancellation: it still owns its
        buffers (see ``wait_complete(cancel=...)``)."""
        super().__init__(self._compose(awaited), layer=layer, awaited=awaited)

    def _headline(self) -> str:
        return f"timed out after {self.elapsed:.3f} s (timeout {self.timeout:.3f} s)"

    def _compose(self, awaited: str) -> str:
        parts = [f"{awaited}: {self._headline()}"]
        if self.expected is not None or self.observed is not None:
            parts.append(
                f"expected {_fmt_value(self.expected)}, observed {_fmt_value(self.observed)}"
            )
        if self.detail:
            parts.append(self.detail)
        return "; ".join(parts)


class HardwareTimeout(_TimedOut):
    """A device, bus or firmware did not complete what was awaited within the wait's timeout."""


class UsbTransferTimeout(HardwareTimeout):
    """A USB transfer (bulk or control) did not complete."""

    default_layer = Layer.USB_TRANSFER


class PcieRequestTimeout(HardwareTimeout):
    """A PCIe request through the bridge (its transfers and retries together), or the link, did not
    complete."""

    default_layer = Layer.PCIE_REQUEST


class SignalTimeout(HardwareTimeout):
    """A timeline signal or fence written by a device queue did not reach its value."""

    default_layer = Layer.GPU_QUEUE


class FirmwareTimeout(HardwareTimeout):
    """A firmware mailbox or register did not respond."""

    default_layer = Layer.FIRMWARE


class CameraTimeout(HardwareTimeout):
    """A camera, or a step on the way to its frames, did not deliver."""

    default_layer = Layer.CAMERA


class ModelTimeout(HardwareTimeout):
    """A model run did not finish."""

    default_layer = Layer.MODEL


class BudgetExhausted(_TimedOut):
    """An enclosing budget (see :func:`aio_runtime.deadline_scope`) ran out during a wait.

    ``budget`` names the scope (``"frame 42"``); ``timeout`` is the scope's total budget and
    ``elapsed`` the time since the scope began. ``awaited`` and ``layer`` describe the wait that was
    pending when the budget ran out.
    """

    def __init__(
        self,
        *,
        budget: str,
        awaited: str,
        timeout: float,
        elapsed: float,
        layer: Layer | None = None,
        expected: object = None,
        observed: object = None,
    ) -> None:
        self.budget = budget
        super().__init__(
            awaited=awaited,
            timeout=timeout,
            elapsed=elapsed,
            layer=layer,
            expected=expected,
            observed=observed,
        )

    def _headline(self) -> str:
        return (
            f"budget '{self.budget}' exhausted after {self.elapsed:.3f} s "
            f"(budget {self.timeout:.3f} s)"
        )


class DeviceLost(RuntimeFault):
    """The device went away (unplugged, reset, no longer enumerates)."""


class TransferError(RuntimeFault):
    """A transfer ended in an error other than a timeout (stall, short transfer, I/O error)."""

    default_layer = Layer.USB_TRANSFER


class FirmwareError(RuntimeFault):
    """Firmware answered with a response code that is not success."""

    default_layer = Layer.FIRMWARE

    def __init__(
        self,
        message: str,
        *,
        code: int,
        awaited: str = "",
        layer: Layer | None = None,
    ) -> None:
        super().__init__(message, layer=layer, awaited=awaited)
        self.code = code


class InvalidOutput(RuntimeFault):
    """A task completed but its output cannot be trusted (wrong length, not finite, out of range)."""

    default_layer = Layer.MODEL


class OutOfMemory(RuntimeFault, MemoryError):
    """An allocator has no free range that satisfies a request."""

    def __init__(
        self,
        message: str,
        *,
        requested: int,
        alignment: int,
        largest_free: int,
        layer: Layer | None = None,
    ) -> None:
        super().__init__(message, layer=layer, awaited="")
        self.requested = requested
        self.alignment = alignment
        self.largest_free = largest_free


class RollbackFailed(ExceptionGroup[Exception]):
    """Acquisition failed and releasing what had been acquired failed too.

    The first exception is the failure that triggered the rollback; the rest are the release
    failures, in the order the releases ran (reverse acquisition order).
    """


class UnboundedWaitError(ValueError):
    """A wait was asked for with neither a timeout nor an enclosing runtime deadline scope.

    A caller's own cancel scope (``anyio.fail_after``) cannot be turned into a typed hardware
    timeout, so it does not count as a bound.
    """


SimpleFault = type[DeviceLost] | type[TransferError] | type[InvalidOutput]


@contextlib.contextmanager
def map_exceptions(
    mapping: Mapping[type[Exception], SimpleFault],
    *,
    layer: Layer | None = None,
    awaited: str = "",
) -> Iterator[None]:
    """Translate a backend's exceptions into the runtime's family at a boundary.

    The first entry whose key matches (``isinstance``) wins; the original is kept as ``__cause__``.
    Exceptions that are already a ``RuntimeFault``, exceptions no entry matches, and every
    :class:`TimeoutError` (a subclass of ``OSError``, so ``{OSError: ...}`` would otherwise catch
    it) pass unchanged. Timeouts become typed errors in the wait primitive, which knows the timeout
    and the elapsed time; a library's own timeout exception must be handled there, not mapped here.
    """
    try:
        yield
    except (RuntimeFault, TimeoutError):
        raise
    except Exception as exc:
        for source, target in mapping.items():
            if isinstance(exc, source):
                text = str(exc) or type(exc).__name__
                message = f"{awaited}: {text}" if awaited else text
                raise target(message, layer=layer, awaited=awaited) from exc
        raise
