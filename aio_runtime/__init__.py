"""aio_runtime — bounded, typed waits for in-car inference hardware.

Every hardware wait is an awaitable with a wall-clock bound and a typed error that names the layer
and what was awaited. The core knows nothing about USB, GPUs or faces; ``transports`` and
``pipelines`` build on it.
"""

from ._core._allocator import AllocatorStatistics, Range, RangeAllocator
from ._core._bounds import BoundArgs, OwnBound, SharedBound, WaitBound
from ._core._clock import (
    Deadline,
    current_deadline,
    deadline_scope,
    loop_clock,
    now,
    validate_timeout,
)
from ._core._completion import Completion, ThreadsafeSetter, Waitable, loop_caller
from ._core._errors import (
    BudgetExhausted,
    CameraTimeout,
    DeviceLost,
    FirmwareError,
    FirmwareTimeout,
    HardwareTimeout,
    InvalidOutput,
    Layer,
    ModelTimeout,
    OutOfMemory,
    PcieRequestTimeout,
    RollbackFailed,
    RuntimeFault,
    SignalTimeout,
    TransferError,
    UnboundedWaitError,
    UsbTransferTimeout,
    map_exceptions,
)
from ._core._health import (
    Availability,
    AvailabilityMachine,
    AvailabilityState,
    Readiness,
    ReadinessLayer,
    Reason,
    Transition,
    reason_kind,
)
from ._core._log import LogEvent, configure_logging, get_logger, log_context
from ._core._mailbox import Mailbox, MailboxLayout, MemoryRegisters, RegisterFile, wait_register
from ._core._notifier import Notifier
from ._core._ownership import (
    Ledger,
    LedgerEntry,
    LedgerKind,
    Owned,
    Stages,
    current_ledger,
    use_ledger,
)
from ._core._policy import DEFAULT_POLICY, PollPolicy
from ._core._resources import AsyncResource, ExcInfo
from ._core._signals import Fence, TimelineSignal, serial_reached
from ._core._starvation import Starvation, run_queue_wait
from ._core._supervision import Backoff, Supervisor, SupervisorStatistics
from ._core._threads import (
    EXIT_GRACE,
    PendingCall,
    WorkerThread,
    can_run_realtime,
    realtime_threads,
    run_in_thread,
    worker_thread_ids,
)
from ._core._waits import (
    IMMEDIATE_BURST,
    ProbeArgs,
    completed_at_once,
    drain,
    pause,
    wait_complete,
    wait_until,
)
from ._core._watcher import MemoryWatcher, Watch, WatcherStatistics, WatcherStopped
from ._version import distribution_version as _distribution_version

__version__ = _distribution_version()
"""The version of the installed ``aio-dms`` distribution (``aio-dms --version``)."""

__all__ = [
    "EXIT_GRACE",
    "DEFAULT_POLICY",
    "IMMEDIATE_BURST",
    "AllocatorStatistics",
    "AsyncResource",
    "ExcInfo",
    "Availability",
    "AvailabilityMachine",
    "AvailabilityState",
    "Backoff",
    "BoundArgs",
    "BudgetExhausted",
    "CameraTimeout",
    "Completion",
    "completed_at_once",
    "Deadline",
    "DeviceLost",
    "Fence",
    "FirmwareError",
    "FirmwareTimeout",
    "HardwareTimeout",
    "InvalidOutput",
    "Layer",
    "Ledger",
    "LedgerEntry",
    "LedgerKind",
    "LogEvent",
    "Mailbox",
    "MailboxLayout",
    "MemoryRegisters",
    "MemoryWatcher",
    "ModelTimeout",
    "Notifier",
    "OutOfMemory",
    "Owned",
    "OwnBound",
    "PcieRequestTimeout",
    "PollPolicy",
    "ProbeArgs",
    "Range",
    "RangeAllocator",
    "Readiness",
    "ReadinessLayer",
    "Reason",
    "RegisterFile",
    "RollbackFailed",
    "RuntimeFault",
    "SharedBound",
    "SignalTimeout",
    "Stages",
    "Starvation",
    "Supervisor",
    "SupervisorStatistics",
    "ThreadsafeSetter",
    "TimelineSignal",
    "TransferError",
    "Transition",
    "UnboundedWaitError",
    "UsbTransferTimeout",
    "WaitBound",
    "Waitable",
    "Watch",
    "WatcherStatistics",
    "WatcherStopped",
    "PendingCall",
    "WorkerThread",
    "can_run_realtime",
    "configure_logging",
    "current_deadline",
    "current_ledger",
    "deadline_scope",
    "drain",
    "loop_caller",
    "loop_clock",
    "get_logger",
    "log_context",
    "map_exceptions",
    "now",
    "pause",
    "realtime_threads",
    "reason_kind",
    "run_in_thread",
    "run_queue_wait",
    "serial_reached",
    "use_ledger",
    "validate_timeout",
    "wait_complete",
    "wait_register",
    "wait_until",
    "worker_thread_ids",
]
