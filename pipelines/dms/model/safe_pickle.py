"""A pickle reader for model metadata: plain data and ``slice``, within limits (design C8).

openpilot stores a model's ``output_slices`` as a pickle. :func:`safe_unpickle` reads one without
an unpickler: it walks the opcodes (:func:`pickletools.genops`) and plays them on a stack of its
own, building only dict, list, tuple, str, int, float, bool, None and ``slice``.

* No global is resolved but ``builtins.slice``: GLOBAL, STACK_GLOBAL, INST and extension codes
  naming anything else are refused by name (:class:`UnsafeMetadata`), and ``slice`` itself is
  never handed out — it is a marker that REDUCE (and INST, OBJ, NEWOBJ) turn into a slice of
  plain values; nothing else is ever called. Persistent ids, sets, bytes, bytearrays and
  out-of-band buffers are refused where they appear; BUILD (setting an object's state) is
  malformed for plain data.
* Every opcode is charged against :class:`MetadataLimits` as it is played: each value made
  counts one object, each memo read or DUP is a shared reference and counts as many objects as
  the value it refers to holds, every container keeps its size and depth as it is filled, and
  integers are bounded as they are read. A self-sharing bomb therefore crosses a limit a few
  dozen opcodes in, while the structure is still as small as the pickle; the finished value is
  measured once more (:func:`~pipelines.dms.model.limits.check_extent`) for what was changed
  after it was shared.
* Anything malformed — truncated, an unknown opcode, a stack that runs out, a memo entry never
  stored, an unhashable key, a slice of containers — is :class:`MetadataError`, saying at which
  byte.
"""

from __future__ import annotations

import copyreg
import pickle
import pickletools
from typing import Any

from .limits import (
    DEFAULT_LIMITS,
    MetadataError,
    MetadataLimits,
    ModelContractError,
    UnsafeMetadata,
    check_extent,
    checked_int,
    grow_extent,
    limit_exceeded,
    shown,
    shown_value,
)

__all__ = ["safe_unpickle"]

_WHERE = "metadata pickle"
_PLAIN = (
    "only plain data (dict, list, tuple, str, int, float, bool, None) and builtins.slice are "
    "allowed"
)
_ALLOWED_GLOBALS = {("builtins", "slice"), ("__builtin__", "slice")}
_ATOMS = (str, int, float, type(None))  # bool is an int
_UNIT = (1, 0)
"""Size and depth of a value that holds nothing."""


class _Slice:
    """``builtins.slice`` as the pickle names it: only ever applied to its arguments."""

    __slots__ = ()


_SLICE = _Slice()
_NO_KWARGS = object()

_REFUSED = {
    "PERSID": "uses a persistent id",
    "BINPERSID": "uses a persistent id",
    "EMPTY_SET": "contains a set",
    "ADDITEMS": "contains a set",
    "FROZENSET": "contains a frozenset",
    "BINBYTES": "contains bytes",
    "SHORT_BINBYTES": "contains bytes",
    "BINBYTES8": "contains bytes",
    "BYTEARRAY8": "contains a bytearray",
    "NEXT_BUFFER": "uses an out-of-band buffer",
    "READONLY_BUFFER": "uses an out-of-band buffer",
}


def _find_global(module: str, name: str) -> _Slice:
    if (module, name) in _ALLOWED_GLOBALS:
        return _SLICE
    raise UnsafeMetadata(f"{_WHERE} refers to {shown(module)}.{shown(name)}; {_PLAIN}")


class _Reader:
    """One read: the stack (a mark is an index into it), the memo, and what the read has been
    charged against the limits so far."""

    def __init__(self, limits: MetadataLimits) -> None:
        self.limits = limits
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.extent: dict[int, tuple[object, list[int]]] = {}
        """id -> (container, [size, depth]) of every container made: kept alive for the read,
        so an id is never reused while it is a key here."""
        self.objects = 0
        self.shared = 0
        self.offset = 0

    # -- the stack

    def push(self, value: object) -> None:
        self.stack.append(value)

    def pop_n(self, n: int) -> list[Any]:
        if len(self.stack) - (self.marks[-1] if self.marks else 0) < n:
            raise MetadataError(f"{_WHERE} runs out of stack at byte {self.offset}")
        items = self.stack[len(self.stack) - n :]
        del self.stack[len(self.stack) - n :]
        return items

    def top(self) -> Any:
        (value,) = self.pop_n(1)
        self.stack.append(value)
        return value

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise MetadataError(f"{_WHERE} has no MARK where one is needed, at byte {self.offset}")
        start = self.marks.pop()
        items = self.stack[start:]
        del self.stack[start:]
        return items

    # -- counting

    def charge(self, objects: int) -> None:
        self.objects += objects
        if self.objects > self.limits.max_objects:
            raise limit_exceeded(self.limits, "max_objects", where=_WHERE, offset=self.offset)

    def measure(self, value: object) -> tuple[int, int]:
        if value is _SLICE:
            raise UnsafeMetadata(f"{_WHERE} holds builtins.slice itself, not a slice; {_PLAIN}")
        entry = self.extent.get(id(value))
        return (entry[1][0], entry[1][1]) if entry is not None else _UNIT

    def grow(self, container: object, child: object) -> None:
        """``child`` was put into ``container``: its size and depth grow with it."""
        size, depth = self.measure(child)
        extent = self.extent[id(container)][1]
        grow_extent(extent, size, depth, self.limits, where=_WHERE, offset=self.offset)

    def made(self, container: Any, children: list[Any] | tuple[Any, ...]) -> Any:
        """Account for a new container that holds ``children``; return it."""
        self.charge(1)
        self.extent[id(container)] = (container, [1, 1])
        for child in children:
            self.grow(container, child)
        return container

    def share(self, value: object) -> None:
        """Push a second reference to ``value``: a shared reference, and another copy of it for
        whoever walks the result. (``slice`` itself, named once and read from the memo for every
        later slice, is not data: it is never put into the result.)"""
        if value is _SLICE:
            self.push(value)
            return
        self.shared += 1
        if self.shared > self.limits.max_shared_references:
            raise limit_exceeded(
                self.limits, "max_shared_references", where=_WHERE, offset=self.offset
            )
        self.charge(self.measure(value)[0])
        self.push(value)

    # -- values

    def atom(self, value: object) -> None:
        if isinstance(value, int):
            checked_int(value, self.limits, where=_WHERE, offset=self.offset)
        self.charge(1)
        self.push(value)

    def into_list(self, items: list[Any]) -> None:
        target = self.top()
        if type(target) is not list:
            raise MetadataError(
                f"{_WHERE} appends to a {type(target).__name__} at byte {self.offset}; only a "
                "list can be appended to"
            )
        for item in items:
            self.grow(target, item)
        target.extend(items)

    def into_dict(self, target: Any, items: list[Any]) -> None:
        if type(target) is not dict:
            raise MetadataError(
                f"{_WHERE} sets an item of a {type(target).__name__} at byte {self.offset}; only "
                "a dict has items"
            )
        if len(items) % 2:
            raise MetadataError(f"{_WHERE} has a key without a value at byte {self.offset}")
        for key, value in zip(items[::2], items[1::2], strict=True):
            self.grow(target, key)
            self.grow(target, value)
            target[key] = value  # hashing a key costs at most its size, which is bounded

    def stack_global(self, module: object, name: object) -> _Slice:
        if not isinstance(module, str) or not isinstance(name, str):
            raise MetadataError(f"{_WHERE} names a global by a non-string at byte {self.offset}")
        return _find_global(module, name)

    def extension(self, code: int) -> _Slice:
        """An extension code (copyreg's registry) names a global: refused unless slice."""
        registry: dict[int, tuple[str, str]] = getattr(copyreg, "_inverted_registry", {})
        if code not in registry:
            raise UnsafeMetadata(f"{_WHERE} uses extension code {code}, not registered; {_PLAIN}")
        return _find_global(*registry[code])

    def make_slice(self, callable_: object, args: object, kwargs: object = _NO_KWARGS) -> slice:
        """``slice(*args)``: the one call a metadata pickle may make."""
        if callable_ is not _SLICE:
            raise MetadataError(
                f"{_WHERE} calls a {type(callable_).__name__} at byte {self.offset}; only "
                "builtins.slice may be called"
            )
        if (
            not isinstance(args, tuple | list)
            or not 1 <= len(args) <= 3
            or not all(isinstance(a, _ATOMS) for a in args)
            or not (kwargs is _NO_KWARGS or kwargs == {})
        ):
            raise MetadataError(
                f"{_WHERE} makes a slice of {shown_value(args)} at byte {self.offset}; expected "
                "slice(start, stop[, step]) of numbers, strings or None"
            )
        made = slice(*args)
        self.made(made, (made.start, made.stop, made.step))
        return made

    # -- one opcode

    def play(self, name: str, arg: Any) -> bool:
        """Play one opcode; ``True`` once the pickle's STOP is reached."""
        match name:
            case "INT" | "BININT" | "BININT1" | "BININT2" | "LONG" | "LONG1" | "LONG4":
                self.atom(arg)
            case "FLOAT" | "BINFLOAT":
                self.atom(float(arg))
            case "NONE" | "NEWTRUE" | "NEWFALSE":
                self.atom({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[name])
            case "UNICODE" | "SHORT_BINUNICODE" | "BINUNICODE" | "BINUNICODE8":
                self.atom(str(arg))
            case "STRING" | "BINSTRING" | "SHORT_BINSTRING":  # protocol 0-1 str, read as ASCII
                if not str(arg).isascii():
                    raise MetadataError(f"{_WHERE} has a non-ASCII STRING at byte {self.offset}")
                self.atom(str(arg))
            case "EMPTY_LIST" | "EMPTY_DICT" | "EMPTY_TUPLE":
                empty = {"EMPTY_LIST": list, "EMPTY_DICT": dict, "EMPTY_TUPLE": tuple}[name]()
                self.push(self.made(empty, ()))
            case "LIST":
                items = self.pop_mark()
                self.push(self.made(list(items), items))
            case "TUPLE" | "TUPLE1" | "TUPLE2" | "TUPLE3":
                items = self.pop_mark() if name == "TUPLE" else self.pop_n(int(name[-1]))
                self.push(self.made(tuple(items), items))
            case "DICT":
                items = self.pop_mark()
                self.push(self.made({}, ()))
                self.into_dict(self.top(), items)
            case "APPEND" | "APPENDS":
                self.into_list(self.pop_n(1) if name == "APPEND" else self.pop_mark())
            case "SETITEM" | "SETITEMS":
                items = self.pop_n(2) if name == "SETITEM" else self.pop_mark()
                self.into_dict(self.top(), items)
            case "MARK":
                self.marks.append(len(self.stack))
            case "POP":
                if len(self.stack) > (self.marks[-1] if self.marks else 0):
                    self.stack.pop()
                else:
                    self.pop_mark()
            case "POP_MARK":
                self.pop_mark()
            case "DUP":
                self.share(self.top())
            case "GET" | "BINGET" | "LONG_BINGET":
                if arg not in self.memo:
                    raise MetadataError(
                        f"{_WHERE} reads memo entry {arg}, never stored, at byte {self.offset}"
                    )
                self.share(self.memo[arg])
            case "PUT" | "BINPUT" | "LONG_BINPUT" | "MEMOIZE":
                self.memo[len(self.memo) if name == "MEMOIZE" else arg] = self.top()
            case "GLOBAL":
                self.push(_find_global(*str(arg).split(" ", 1)))
            case "STACK_GLOBAL":
                self.push(self.stack_global(*self.pop_n(2)))
            case "EXT1" | "EXT2" | "EXT4":
                self.push(self.extension(arg))
            case "REDUCE" | "NEWOBJ":
                self.push(self.make_slice(*self.pop_n(2)))
            case "NEWOBJ_EX":
                self.push(self.make_slice(*self.pop_n(3)))
            case "INST":
                found = _find_global(*str(arg).split(" ", 1))
                self.push(self.make_slice(found, self.pop_mark()))
            case "OBJ":
                items = self.pop_mark()
                self.push(self.make_slice(items[0] if items else None, items[1:]))
            case "PROTO":
                if not 0 <= arg <= pickle.HIGHEST_PROTOCOL:
                    raise MetadataError(f"{_WHERE} is of unknown protocol {arg}")
            case "FRAME":
                pass
            case "STOP":
                return True
            case _ if name in _REFUSED:
                raise UnsafeMetadata(f"{_WHERE} {_REFUSED[name]} at byte {self.offset}; {_PLAIN}")
            case _:  # BUILD, and any opcode a later protocol adds
                raise MetadataError(
                    f"{_WHERE} uses {name} at byte {self.offset}, which plain data does not need"
                )
        return False

    def read(self, data: bytes) -> object:
        for opcode, arg, position in pickletools.genops(data):
            self.offset = int(position or 0)
            if self.play(opcode.name, arg):
                (value,) = self.pop_n(1)
                self.measure(value)  # refuses builtins.slice itself
                return value
        raise MetadataError(f"{_WHERE} ends without STOP")


def safe_unpickle(data: bytes, limits: MetadataLimits = DEFAULT_LIMITS) -> object:
    """Read a pickle of plain data and ``slice`` only, within ``limits``.

    Raises :class:`UnsafeMetadata` for anything else (before anything is called),
    :class:`~pipelines.dms.model.limits.MetadataLimitExceeded` for a pickle past a limit
    (saying which, and at which byte), :class:`MetadataError` for a malformed pickle."""
    if len(data) > limits.max_bytes:
        raise limit_exceeded(limits, "max_bytes", where=_WHERE, found=f" (found {len(data)})")
    reader = _Reader(limits)
    try:
        value = reader.read(bytes(data))
    except ModelContractError:
        raise
    except Exception as exc:  # truncated, bad opcodes and arguments, an unhashable key, ...
        raise MetadataError(
            f"metadata is not a readable pickle (at byte {reader.offset}): "
            f"{shown(f'{type(exc).__name__}: {exc}', width=160)}"
        ) from exc
    check_extent(value, limits, where=_WHERE)
    return value
