"""The fleet's driver: hands recordings to the workers (Ray actors), bounds, retries, summarises.

Ray schedules the actors and restarts one whose process dies; the driver keeps one recording in
flight per worker and decides what a failure means:

- a worker that died while replaying (killed, out of memory, crashed): the recording is handed
  out again, up to :attr:`FleetOptions.attempts` times in all; the attempt that completes writes
  the frames file whole (an earlier one left at most a hidden partial file, replaced), so the
  dataset holds each frame once;
- a recording that fails (it cannot be read, it is damaged): it fails alone, with its reason,
  and the rest go on;
- a worker past its recording's wall-clock bound (hung: its event loop stopped, its process
  stopped) — :attr:`FleetOptions.start_timeout` seconds, plus
  :attr:`FleetOptions.frame_timeout` a frame once the worker has said how long the recording is —
  is killed and the recording fails there, not retried (the driver does not wait for Ray to say
  the replay ended: Ray says so only once it has started the worker again, which a process that
  hangs as it starts may never let it); Ray starts another in its place, and a worker that has
  not answered within :attr:`FleetOptions.start_timeout` of being started again is given up
  for a fresh one;
- a stop asked for (Ctrl-C): the replays in flight are cancelled (each leaves its partial file),
  the recordings not complete are marked interrupted.

As it ends, however it ends, its outputs are written (:mod:`.outputs`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aio_runtime import get_logger

from ..summary import utc_now
from .cluster import ClusterError, FleetCluster, local_cpus
from .outputs import FleetResult, Replayed, run_document, write_outputs
from .plan import FleetPlan
from .summary import (
    RecordingSummary,
    failed_summary,
)
from .worker import ReplayTask, ReplayWorker, WorkerProgress

__all__ = ["FleetProgress", "FleetResult", "run_fleet"]

_log = get_logger(__name__)
_WAIT = 0.2
"""Seconds the driver waits for a result before it looks at bounds, progress and stops."""
_POLL = 0.5
"""Seconds between two progress questions to a worker."""
_CANCEL_GRACE = 10.0
"""Seconds cancelled replays may take to end before their workers are killed."""


@dataclass(frozen=True)
class FleetProgress:
    """Where a run is: recordings done (of all), failed, frames replayed, frames a second."""

    done: int
    total: int
    failed: int
    frames: int
    frames_per_second: float | None


@dataclass
class _Running:
    task: ReplayTask
    actor: Any
    handed: float
    length: int | None = None
    frames: int = 0
    poll: Any = None
    polled: float = 0.0


class _Driver:
    def __init__(
        self,
        plan: FleetPlan,
        actors: list[Any],
        stop: threading.Event,
        progress: Callable[[FleetProgress], None] | None,
    ) -> None:
        self.plan = plan
        self.options = plan.options
        self.idle = list(actors)
        self.restarting: dict[Any, tuple[Any, float]] = {}
        """A question to each worker whose process died, until Ray has started it again: the
        worker, and since when it has been waited for."""
        self.asking: list[tuple[float, Any, float]] = []
        """Workers to ask again (when, which, since when): Ray had not started them again."""
        self.pending = deque(plan.tasks)
        self.running: dict[Any, _Running] = {}
        self.results: list[RecordingSummary] = []
        self.stop = stop
        self.progress = progress
        self.first: float | None = None
        self.last: float | None = None
        self.frames = 0

    def run(self) -> bool:
        """Hand out every task; False when stopped first."""
        import ray

        while self.pending or self.running:
            if self.stop.is_set():
                self._cancel_all()
                return False
            while self.idle and self.pending:
                self._hand_out(self.pending.popleft(), self.idle.pop())
            self._ask_again()
            waited = [*self.running, *self.restarting]
            if waited:
                ready, _ = ray.wait(waited, num_returns=1, timeout=_WAIT)
            else:  # every worker is being started again: nothing to wait for but time
                ready = []
                self.stop.wait(_WAIT)
            for ref in ready:
                if ref in self.restarting:
                    self._started_again(ref)
                else:
                    self._finished(ref)
            self._look_at_workers()
            self._show()
        return True

    def _restarted(self, actor: Any, since: float | None = None) -> None:
        """``actor``'s process died: it takes work again once Ray has started it again (a task
        handed to it before then fails as the dead one's did)."""
        since = time.monotonic() if since is None else since
        self.restarting[actor.where.remote()] = (actor, since)

    def _ask_again(self) -> None:
        """Ask again the workers Ray had not started yet, and give up on the ones waited for
        longer than a replay may take to start."""
        now = time.monotonic()
        late = self.options.start_timeout
        for ref, (actor, since) in list(self.restarting.items()):
            if now - since > late:
                del self.restarting[ref]
                self._replace(actor)
        asking, self.asking = self.asking, []
        for when, actor, since in asking:
            if now - since > late:
                self._replace(actor)
            elif when <= now:
                self._restarted(actor, since)
            else:
                self.asking.append((when, actor, since))

    def _replace(self, actor: Any) -> None:
        import ray

        _log.warning("a worker not started again in time: another started instead")
        ray.kill(actor, no_restart=True)
        self.idle.extend(_actors(1))

    def _started_again(self, ref: Any) -> None:
        import ray
        from ray.exceptions import ActorDiedError, RayActorError

        actor, since = self.restarting.pop(ref)
        try:
            ray.get(ref)
        except ActorDiedError as exc:  # for good (Ray will not start it again): another instead
            _log.warning("a worker is gone for good: another started", error=_first_line(exc))
            self.idle.extend(_actors(1))
        except RayActorError:  # not started again yet
            self.asking.append((time.monotonic() + _WAIT, actor, since))
        else:
            _log.info("a worker was started again")
            self.idle.append(actor)

    def _hand_out(self, task: ReplayTask, actor: Any) -> None:
        now = time.monotonic()
        self.first = self.first or now
        self.running[actor.replay.remote(task)] = _Running(task, actor, now)

    def _bound(self, running: _Running) -> float:
        frames = running.length or 0
        return running.handed + self.options.start_timeout + frames * self.options.frame_timeout

    def _finished(self, ref: Any) -> None:
        import ray
        from ray.exceptions import RayActorError, TaskCancelledError

        running = self.running.pop(ref)
        task = running.task
        facts = {"model": task.model, "attempts": task.attempt}
        try:
            summary: RecordingSummary = ray.get(ref)
        except RayActorError as exc:
            _log.warning(
                "a worker died replaying", recording=task.recording, model=task.model,
                attempt=task.attempt, error=_first_line(exc),
            )  # fmt: skip
            self._restarted(running.actor)
            if task.attempt < self.options.attempts:
                self.pending.appendleft(dataclasses.replace(task, attempt=task.attempt + 1))
                return
            else:
                reason = f"its worker died {task.attempt} times (last: {_first_line(exc)})"
                summary = failed_summary(task.recording, task.path, **facts, reason=reason)
        except TaskCancelledError:
            self.idle.append(running.actor)
            summary = failed_summary(
                task.recording, task.path, **facts, status="interrupted", reason="stopped"
            )
        except Exception as exc:  # the replay raised: a fault of ours, reported with the rest
            self.idle.append(running.actor)
            reason = f"the replay raised {_first_line(exc)}"
            summary = failed_summary(task.recording, task.path, **facts, reason=reason)
        else:
            self.idle.append(running.actor)
        self._ended(summary)

    def _ended(self, summary: RecordingSummary) -> None:
        self.last = time.monotonic()
        self.frames += summary["frames"]
        self.results.append(summary)

    def _look_at_workers(self) -> None:
        """Ask each busy worker where it is (one question at a time), and kill the ones past
        their bound."""
        import ray

        now = time.monotonic()
        for ref, running in list(self.running.items()):
            if running.poll is not None:
                ready, _ = ray.wait([running.poll], timeout=0)
                if ready:
                    try:
                        answer: WorkerProgress = ray.get(running.poll)
                    except Exception:  # the worker is gone: its replay's result says how
                        answer = WorkerProgress(None, 0, None)
                    running.poll = None
                    if answer.recording == running.task.recording:
                        running.frames, running.length = answer.frames, answer.length
            bound = self._bound(running)
            if now > bound:
                self._kill(ref, bound - running.handed)
            elif running.poll is None and now - running.polled >= _POLL:
                running.poll, running.polled = running.actor.progress.remote(), now

    def _kill(self, ref: Any, seconds: float) -> None:
        """The replay of ``ref`` is past its bound of ``seconds``: its worker is killed, its
        recording failed here."""
        import ray

        running = self.running.pop(ref)
        task = running.task
        _log.warning("a worker past its bound killed", recording=task.recording)
        ray.kill(running.actor, no_restart=False)
        self._restarted(running.actor)
        reason = f"its worker exceeded the recording's bound of {seconds:.1f} s (hung): killed"
        self._ended(
            failed_summary(
                task.recording, task.path, model=task.model, attempts=task.attempt, reason=reason
            )
        )

    def _cancel_all(self) -> None:
        import ray

        for ref in self.running:
            ray.cancel(ref)
        if self.running:  # each ends at its next await; all of them within the grace
            flying = list(self.running)
            ready, _ = ray.wait(flying, num_returns=len(flying), timeout=_CANCEL_GRACE)
            for ref in ready:
                self._finished(ref)
        for ref, running in list(self.running.items()):  # past the grace: ended
            ray.kill(running.actor, no_restart=True)
            task = running.task
            self.results.append(
                failed_summary(
                    task.recording, task.path, model=task.model, attempts=task.attempt,
                    status="interrupted", reason="stopped",
                )
            )  # fmt: skip
            del self.running[ref]
        for task in self.pending:
            self.results.append(
                failed_summary(
                    task.recording, task.path, model=task.model, attempts=task.attempt,
                    status="interrupted", reason="not started",
                )
            )  # fmt: skip
        self.pending.clear()

    def replayed(self) -> Replayed:
        return Replayed(self.results, self.frames, self.first, self.last)

    def _show(self) -> None:
        if self.progress is None:
            return
        done = len(self.plan.resumed) + len(self.results)
        flying = sum(running.frames for running in self.running.values())
        elapsed = time.monotonic() - self.first if self.first is not None else 0.0
        rate = (self.frames + flying) / elapsed if elapsed > 0 else None
        failed = sum(1 for s in self.results if s["status"] != "complete")
        total = len(self.plan.resumed) + len(self.plan.tasks)
        self.progress(FleetProgress(done, total, failed, self.frames + flying, rate))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def run_fleet(
    plan: FleetPlan,
    *,
    stop: threading.Event | None = None,
    progress: Callable[[FleetProgress], None] | None = None,
    cluster: FleetCluster | None = None,
) -> FleetResult:
    """Run ``plan`` on ``cluster`` (None: one made of the options' address, started and ended
    here); ``stop``: set to stop it (the replays in flight cancelled); ``progress``: called as it
    goes. :class:`~.cluster.ClusterError` where the cluster cannot be had, or has fewer CPUs
    than workers asked for; :class:`OSError` where the outputs cannot be written."""
    options = plan.options
    stop = stop or threading.Event()
    started_at = utc_now()
    own = cluster is None
    if own and options.address is None and (options.workers or 0) > local_cpus():
        raise ClusterError(
            f"--workers {options.workers}: this machine has {local_cpus()} CPUs for a local cluster"
        )
    if not plan.tasks:  # every recording was replayed by the run resumed: nothing to start
        return write_outputs(plan, Replayed(), "complete", started_at, None)
    cluster = cluster or FleetCluster(options.address)
    with cluster if own else _nothing():
        cpus = cluster.cpus()
        workers = options.workers or cpus
        if workers > cpus:
            raise ClusterError(f"--workers {workers}: the cluster has {cpus} CPUs")
        for kind, run in plan.runs.items():
            run.write_run(run_document(plan, kind, "running", started_at, [], None))
        driver = _Driver(plan, _actors(min(workers, len(plan.tasks))), stop, progress)
        try:
            complete = driver.run()
        except BaseException:  # a fault of ours, or the cluster lost: said so, then raised
            with contextlib.suppress(Exception):
                write_outputs(plan, driver.replayed(), "failed", started_at, cluster.start_seconds)
            raise
        finally:
            if not own or stop.is_set():
                _end(driver)
    state = "complete" if complete else "interrupted"
    return write_outputs(plan, driver.replayed(), state, started_at, cluster.start_seconds)


def _nothing() -> Any:
    return contextlib.nullcontext()


def _actors(count: int) -> list[Any]:
    import ray

    worker = ray.remote(ReplayWorker).options(
        num_cpus=1, max_restarts=-1, max_task_retries=0, max_concurrency=2
    )
    return [worker.remote() for _ in range(count)]


def _end(driver: _Driver) -> None:
    import ray

    actors = [*driver.idle, *(a for a, _ in driver.restarting.values())]
    actors += [actor for _, actor, _ in driver.asking]
    for actor in actors + [r.actor for r in driver.running.values()]:
        ray.kill(actor, no_restart=True)
