"""Closeable resources: ``async with`` closes them, by the one method each of them implements."""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ["AsyncResource", "ExcInfo"]

ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
"""What leaving a ``with`` block hands ``__exit__``/``__aexit__``: the exception's type, the
exception and its traceback (all None when the block ended normally). Written once for every exit
that passes them on: ``async def __aexit__(self, *exc_info: *ExcInfo)``."""


class AsyncResource(metaclass=ABCMeta):
    """A resource closed by ``await resource.aclose()``, or by leaving ``async with resource:``.

    Entering returns the resource itself; leaving calls :meth:`aclose` once, whether the block
    ended normally, by an exception or by cancellation, and lets that exception propagate. A
    subclass implements :meth:`aclose` only; one that must still await while its owner is being
    cancelled shields that part (``anyio.CancelScope(shield=True)``), bounded.
    """

    __slots__ = ()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @abstractmethod
    async def aclose(self) -> None:
        """Close the resource."""
