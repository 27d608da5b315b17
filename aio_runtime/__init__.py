"""aio_runtime — bounded, typed waits for in-car inference hardware.

Every hardware wait is an awaitable with a wall-clock bound and a typed error that names the layer
and what was awaited. The core knows nothing about USB, GPUs or faces; ``transports`` and
``pipelines`` build on it.
"""

from .allocator import AllocatorStatistics, Range, RangeAllocator
from .clock import (
    Deadline,
    current_deadline,
    deadline_scope,
    loop_clock,
    now,
    validate_timeout,
)
from .completion import Completion, ThreadsafeSetter, Waitable, loop_caller
from .errors import (
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
from .health import (
    Availability,
    AvailabilityMachine,
    AvailabilityState,
    Readiness,
    ReadinessLayer,
    Transition,
)
from .log import configure_logging, get_logger, log_context
from .mailbox import Mailbox, MailboxLayout, MemoryRegisters, RegisterFile, wait_register
from .ownership import Ledger, LedgerEntry, Owned, Stages, current_ledger, use_ledger
from .signals import Fence, TimelineSignal, serial_reached
from .supervision import Backoff, Supervisor, SupervisorStatistics
from .threads import PendingCall, WorkerThread, run_in_thread
from .waits import (
    DEFAULT_POLICY,
    PollPolicy,
    WaitBound,
    pause,
    wait_complete,
    wait_until,
)
from .watcher import MemoryWatcher, Watch, WatcherStatistics, WatcherStopped

__all__ = [
    "DEFAULT_POLICY",
    "AllocatorStatistics",
    "Availability",
    "AvailabilityMachine",
    "AvailabilityState",
    "Backoff",
    "BudgetExhausted",
    "CameraTimeout",
    "Completion",
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
    "Mailbox",
    "MailboxLayout",
    "MemoryRegisters",
    "MemoryWatcher",
    "ModelTimeout",
    "OutOfMemory",
    "Owned",
    "PcieRequestTimeout",
    "PollPolicy",
    "Range",
    "RangeAllocator",
    "Readiness",
    "ReadinessLayer",
    "RegisterFile",
    "RollbackFailed",
    "RuntimeFault",
    "SignalTimeout",
    "Stages",
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
    "configure_logging",
    "current_deadline",
    "current_ledger",
    "deadline_scope",
    "loop_caller",
    "loop_clock",
    "get_logger",
    "log_context",
    "map_exceptions",
    "now",
    "pause",
    "run_in_thread",
    "serial_reached",
    "use_ledger",
    "validate_timeout",
    "wait_complete",
    "wait_register",
    "wait_until",
]
