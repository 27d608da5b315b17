"""Running a DMS model: onnxruntime on the CPU, on a worker thread, under the frame's bound.

:class:`OnnxRunner` loads a model whose contract checks out
(:func:`~pipelines.dms.model.contract.read_contract`, then one run of its session on zero inputs,
:func:`~pipelines.dms.model.contract.check_real_output`) and runs it with :meth:`OnnxRunner.run`:

* The session runs on a worker thread (:func:`aio_runtime.run_in_thread`); onnxruntime releases the
  GIL, so the event loop stays free.
* Every run is bounded: by its ``timeout`` (:class:`~aio_runtime.ModelTimeout`) and by an enclosing
  ``deadline_scope`` such as a frame's (:class:`~aio_runtime.BudgetExhausted`). When the bound is
  reached the run is asked to stop — ``RunOptions.terminate = True``, which onnxruntime checks
  between nodes — and the thread is awaited (shielded, at most ``drain_timeout``) before the error
  is raised, so the inputs are never released under a run still in flight. A run that does not
  stop in time is reported (``in_flight = True``); the later runs wait for it, each within its own
  bound (one whose bound is reached while it waits is withdrawn, never run).
* Runs never overlap: one at a time on the runner's thread, in order of arrival; waiting for the
  runner counts against the waiting run's bound. A run asked for while another is in progress is
  handed to the thread at once, so it starts the moment the earlier one returns (no round trip
  through the event loop between two runs); with ``replace_waiting`` a newer run withdraws one
  still waiting (:class:`RunSuperseded`).
* The inputs are copied for the run (unless ``handed_over``) and the output is copied out: the
  caller may reuse its arrays as soon as ``run`` returns, and the returned array is the caller's.

Errors: :class:`~aio_runtime.ModelTimeout` / :class:`~aio_runtime.BudgetExhausted` (overrun),
:class:`~aio_runtime.InvalidOutput` (the output is not the length the contract says),
:class:`ModelRunFailed` (onnxruntime reported an error), :class:`ModelInputError` (a ``ValueError``:
wrong input shape, dtype, a calibration that is not finite) — raised before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from pathlib import Path

import anyio
import numpy as np
import numpy.typing as npt
import onnxruntime as ort  # type: ignore[import-untyped]

from aio_runtime import (
    InvalidOutput,
    Layer,
    ModelTimeout,
    PendingCall,
    Readiness,
    ReadinessLayer,
    RuntimeFault,
    WaitBound,
    WorkerThread,
    run_in_thread,
    validate_timeout,
)

from ..config.settings import ServiceConfig
from ..model.contract import (
    CALIB,
    CALIB_SHAPE,
    INPUT_IMG,
    INPUT_IMG_SHAPE,
    ModelContract,
    check_real_output,
    read_contract,
)
from ..model.limits import ModelContractError
from .base import Device, Inference, ModelBackend
from .link import TransportOpener

__all__ = [
    "CpuBackend",
    "ModelInputError",
    "ModelRunFailed",
    "OnnxRunner",
    "RunSuperseded",
    "RunnerStatistics",
    "open_device",
]

FloatArray = npt.NDArray[np.float32]


class ModelInputError(ValueError):
    """An input does not fit the model's contract; nothing was run."""


class RunSuperseded(Exception):
    """The run was withdrawn before it started, in favour of a later one (``replace_waiting``):
    nothing ran; not a fault."""


class ModelRunFailed(RuntimeFault):
    """onnxruntime reported an error for a run it was not asked to stop."""

    default_layer = Layer.MODEL


@dataclass
class RunnerStatistics:
    """Counts since the runner was made (:meth:`OnnxRunner.statistics` gives a copy). ``runs``:
    runs started; ``terminated``: runs onnxruntime stopped on request."""

    runs: int = 0
    completed: int = 0
    timed_out: int = 0
    terminated: int = 0
    failed: int = 0
    invalid_output: int = 0
    superseded: int = 0
    """Runs withdrawn before they started, in favour of a later one."""
    running: int = 0
    """Runs executing now."""

    @property
    def in_flight(self) -> bool:
        """A run is still executing (one that did not stop when asked, or one in progress)."""
        return self.running > 0


class OnnxRunner:
    """A DMS model on onnxruntime's CPU provider. Use one runner from one event loop.

    ``intra_op_threads`` (default 1): threads one run may use. ``drain_timeout``: how long an
    overrunning run is awaited after being asked to stop. ``cpus``: the CPUs the runner's thread
    runs on (see :class:`~aio_runtime.WorkerThread`). ``contract``: the model's contract, already
    checked by the caller (:func:`~pipelines.dms.model.contract.load_contract`); by default it is read
    from the file and checked by one run of the runner's session on zero inputs, so the output
    slices are known to fit the real output. Creating the runner blocks for a few tens of
    milliseconds; :meth:`open` does it on a worker thread under a bound.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        intra_op_threads: int = 1,
        drain_timeout: float = 1.0,
        contract: ModelContract | None = None,
        cpus: Collection[int] | None = None,
    ) -> None:
        if isinstance(intra_op_threads, bool) or not isinstance(intra_op_threads, int):
            raise TypeError(f"intra_op_threads must be an int, got {intra_op_threads!r}")
        if intra_op_threads < 1:
            raise ValueError(f"intra_op_threads must be at least 1, got {intra_op_threads}")
        drain = validate_timeout(drain_timeout, what="drain_timeout")
        assert drain is not None
        self.path = Path(model)
        read = contract if contract is not None else read_contract(self.path)
        self.intra_op_threads = intra_op_threads
        self.drain_timeout = drain
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Idle pool threads would otherwise spin for a while after each run, taking a core from
        # the event loop and the warp on a small machine.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(
                str(self.path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise ModelContractError(f"onnxruntime cannot load {self.path}: {exc}") from exc
        self.contract = read if contract is not None else check_real_output(read, self._session)
        self._output_name = self.contract.output.name
        self._worker = WorkerThread(f"model {self.path.name}", cpus=cpus)
        """Runs the model: one long-lived thread, so runs never overlap and follow each other
        without waiting for the event loop in between."""
        self._waiting: _Turn | None = None
        """The latest run asked for (still waiting for the thread, or not any more)."""
        self._counts = RunnerStatistics()
        self._count_lock = threading.Lock()
        """Held for the counts kept on the runner's thread (and for reading them all)."""

    @classmethod
    async def open(
        cls,
        model: str | Path,
        *,
        timeout: float,
        intra_op_threads: int = 1,
        drain_timeout: float = 1.0,
        cpus: Collection[int] | None = None,
        contract: ModelContract | None = None,
    ) -> OnnxRunner:
        """Check the contract (unless ``contract``: one already checked) and create the session
        on a worker thread, bounded by ``timeout`` (:class:`~aio_runtime.ModelTimeout`) and any
        enclosing deadline scope."""
        return await run_in_thread(
            lambda: cls(
                model,
                intra_op_threads=intra_op_threads,
                drain_timeout=drain_timeout,
                cpus=cpus,
                contract=contract,
            ),
            awaited=f"loading model {Path(model).name}",
            error=ModelTimeout,
            timeout=timeout,
        )

    def statistics(self) -> RunnerStatistics:
        with self._count_lock:
            return dataclasses.replace(self._counts)

    @staticmethod
    def _checked_inputs(
        img: npt.ArrayLike, calib: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.uint8], FloatArray]:
        image = np.asarray(img)
        if image.dtype != np.uint8 or image.size != INPUT_IMG_SHAPE[1]:
            raise ModelInputError(
                f"{INPUT_IMG} is {image.dtype} {image.shape}; expected uint8 with "
                f"{INPUT_IMG_SHAPE[1]} values (the 960x1440 warped luma, row-major)"
            )
        try:
            vector = np.asarray(calib, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ModelInputError(f"{CALIB} is not numeric: {exc}") from exc
        if vector.size != CALIB_SHAPE[1]:
            raise ModelInputError(
                f"{CALIB} has shape {vector.shape}; expected 3 values (roll, pitch, yaw)"
            )
        if not np.isfinite(vector).all():
            raise ModelInputError(f"{CALIB} is {vector.reshape(-1).tolist()}; expected finite")
        return image.reshape(INPUT_IMG_SHAPE), vector.reshape(CALIB_SHAPE)

    def _checked_output(self, flat: FloatArray) -> FloatArray:
        declared = self.contract.declared_output_length
        needed = self.contract.slices_end
        if (declared is not None and flat.size != declared) or flat.size < needed:
            self._counts.invalid_output += 1
            expected = declared if declared is not None else f"at least {needed}"
            raise InvalidOutput(
                f"model output {self._output_name!r} has {flat.size} values; expected {expected}",
                awaited=f"model run ({self.path.name})",
            )
        return flat

    def close(self) -> None:
        """Let the runner's worker thread end (once the run in progress, if any, returns)."""
        self._worker.close()

    def run_blocking(self, img: npt.ArrayLike, calib: npt.ArrayLike) -> FloatArray:
        """One run on the calling thread, with no bound of its own: for a simulated device's
        kernel, which runs it on a worker thread and is bounded as device work is. Do not mix
        with :meth:`run` on one runner."""
        image, vector = self._checked_inputs(img, calib)
        (result,) = self._session.run([self._output_name], {INPUT_IMG: image, CALIB: vector})
        return self._checked_output(np.array(result, dtype=np.float32).reshape(-1))

    async def run(
        self,
        img: npt.ArrayLike,
        calib: npt.ArrayLike,
        *,
        timeout: float | None = None,
        handed_over: bool = False,
        replace_waiting: bool = False,
    ) -> FloatArray:
        """Run the model once; return its output, flat, as a new float32 array.

        ``img``: uint8, 1382400 values (any shape, e.g. (960, 1440)); ``calib``: 3 finite numbers.
        ``handed_over``: the caller gives the arrays to the run and will not change them until
        it has returned — no copy is made (a copy of a 1.4 MB image per frame is otherwise the
        default). Bounded by ``timeout`` and any enclosing ``deadline_scope`` (at least one is required:
        :class:`~aio_runtime.UnboundedWaitError` otherwise), including the time spent waiting for
        an earlier run. See the module docstring for the errors.

        A run may be asked for while another is in progress: it waits on the runner's thread and
        starts the moment the earlier one returns. ``replace_waiting``: a run of this runner that
        is still waiting is withdrawn in favour of this one — its caller gets
        :class:`RunSuperseded` at once (latest frame wins).
        """
        image, vector = self._checked_inputs(img, calib)
        awaited = f"model run ({self.path.name})"
        bound = WaitBound(awaited=awaited, error=ModelTimeout, timeout=timeout)
        feed_img = image if handed_over and image.flags.c_contiguous else image.copy()
        feeds = {INPUT_IMG: feed_img, CALIB: vector.copy()}
        options = ort.RunOptions()
        turn = _Turn()
        if replace_waiting and self._waiting is not None:
            self._waiting.supersede()
        self._waiting = turn

        def call() -> FloatArray:
            with self._count_lock:
                self._counts.runs += 1
                self._counts.running += 1
            try:
                (result,) = self._session.run([self._output_name], feeds, options)
                return np.array(result, dtype=np.float32).reshape(-1)  # a copy: the caller's
            except Exception as exc:
                if options.terminate:
                    with self._count_lock:
                        self._counts.terminated += 1
                    raise
                raise ModelRunFailed(f"onnxruntime: {exc}", awaited=awaited) from exc
            finally:
                with self._count_lock:
                    self._counts.running -= 1

        def terminate() -> None:
            options.terminate = True

        try:
            with turn.scope:
                flat = await run_in_thread(
                    call,
                    worker=self._worker,
                    submitted=turn.submitted,
                    awaited=awaited,
                    within=bound,
                    cancel=terminate,
                    drain_timeout=self.drain_timeout,
                )
        except TimeoutError:
            if not turn.superseded:
                self._counts.timed_out += 1
                raise
        except ModelRunFailed:
            self._counts.failed += 1
            raise
        if turn.superseded:  # replaced, whatever woke the wait first (its bound, the withdrawal)
            self._counts.superseded += 1
            raise RunSuperseded(f"{awaited}: replaced by a later run before it started") from None
        self._counts.completed += 1
        return self._checked_output(flat)


class _Turn:
    """One run's place on the runner's thread. Superseded while it is still queued, it is
    withdrawn (it never runs) and its caller is woken."""

    __slots__ = ("call", "scope", "superseded")

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        """Around the caller's wait: cancelled when the run is superseded."""
        self.call: PendingCall | None = None
        self.superseded = False

    def submitted(self, call: PendingCall) -> None:
        self.call = call

    def supersede(self) -> None:
        """On the loop: withdraw the run if it has not started (then wake its caller)."""
        if self.call is not None and self.call.withdraw():
            self.superseded = True
            self.scope.cancel()


class CpuBackend:
    """onnxruntime on the CPU: runs follow each other on the runner's thread."""

    runs_back_to_back = True

    def __init__(self, runner: OnnxRunner) -> None:
        self.runner = runner

    async def infer(self, image: np.ndarray, calib: np.ndarray) -> Inference:
        start = time.perf_counter()
        output = await self.runner.run(image, calib, handed_over=True, replace_waiting=True)
        return Inference(output, time.perf_counter() - start)

    async def aclose(self) -> None:
        """Nothing: the runner belongs to the device, which closes it."""


@contextlib.asynccontextmanager
async def open_device(
    config: ServiceConfig,
    path: Path,
    contract: ModelContract,
    *,
    plan: object = None,
    transport: TransportOpener | None = None,
    model_cpus: frozenset[int] | None = None,
) -> AsyncIterator[Device]:
    """onnxruntime on the CPU, its runner's thread on ``model_cpus``: a device of one session
    that is never restarted (a fault is each frame's own). ``plan`` (the simulated accelerator's
    fault plan) and ``transport`` are the accelerator's: none here (see
    :func:`~pipelines.dms.backends.base.simulator_plan`)."""
    runner = await OnnxRunner.open(
        path,
        timeout=config.model_load_timeout,
        intra_op_threads=config.intra_op_threads,
        cpus=model_cpus,
        contract=contract,  # checked as it was loaded: not run on zeros a second time
    )

    @contextlib.asynccontextmanager
    async def session(readiness: Readiness) -> AsyncIterator[ModelBackend]:
        for layer in (
            ReadinessLayer.DEVICE_ONLINE,
            ReadinessLayer.FIRMWARE_READY,
            ReadinessLayer.QUEUE_SUBMITTABLE,
        ):
            readiness.mark_up(layer)
        yield CpuBackend(runner)

    try:
        yield Device("cpu", contract, session, restartable=False)
    finally:
        runner.close()
